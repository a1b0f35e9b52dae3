"""``zmesh http`` under faults: a replica SIGKILLed under load costs no request, a
client that goes away closes its stream in the replica, and a client that
does not read holds the gateway and the replica to a bound."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from _helpers import wait_for
from integration._gateway import Gateway, services_behind_gateway

pytestmark = [pytest.mark.slow, pytest.mark.chaos]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with services_behind_gateway(tmp_path_factory.mktemp("http-faults")) as gateway:
        yield gateway


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _open_stream(gw: Gateway, endpoint: str, *args: object) -> socket.socket:
    """A raw socket with a streaming request sent on it (nothing read yet)."""
    sock = socket.create_connection(gw.address, timeout=30)
    body = json.dumps({"args": list(args)}).encode()
    sock.sendall(
        f"POST /v1/model/{endpoint} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {gw.token}\r\n"
        f"Accept: text/event-stream\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


def _read_until(sock: socket.socket, needle: bytes, count: int) -> bytes:
    got = b""
    deadline = time.monotonic() + 30
    while got.count(needle) < count:
        assert time.monotonic() < deadline, got[-500:]
        chunk = sock.recv(65536)
        assert chunk, got[-500:]
        got += chunk
    return got


def test_requests_keep_succeeding_while_a_replica_is_sigkilled(gw: Gateway) -> None:
    pids = {gw.call("model", "pid") for _ in range(4)}
    assert len(pids) == 2
    victim = sorted(pids)[0]
    results: list[int] = []
    failures: list[object] = []
    stop = threading.Event()

    def client(k: int) -> None:
        conn = gw.connection()  # keep-alive: one connection for every request
        i = 0
        try:
            while not stop.is_set():
                status, _, doc = gw.request("POST", "/v1/model/add", {"args": [k, i]}, conn=conn)
                if status != 200 or doc != {"result": k + i}:
                    failures.append((status, doc))
                results.append(status)
                i += 1
        except Exception as exc:  # a dropped connection is a failed request too
            failures.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(results) >= 50, 30, "requests before the kill")
        before = len(results)
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: len(results) >= before + 300, 60, "requests after the kill")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert failures == []
    assert len(results) >= 350
    # The replica is back: both serve again, the victim's pid among neither.
    wait_for(
        lambda: len({gw.call("model", "pid") for _ in range(4)} - {victim}) == 2,
        60,
        "the killed replica respawned",
    )


def test_a_client_that_goes_away_closes_the_stream_in_the_replica(
    gw: Gateway, tmp_path: Path
) -> None:
    marker = tmp_path / "closed"
    sock = _open_stream(gw, "forever", str(marker))
    try:
        head = _read_until(sock, b"\n\n", 3)
        assert head.startswith(b"HTTP/1.1 200")
    finally:
        sock.close()
    # The generator's finally ran in the replica: the gateway closed the stream.
    wait_for(marker.exists, 20, "the generator closed in the replica")
    assert int(marker.read_text() or 0) >= 3
    assert gw.call("model", "add", 1, 1) == 2


@pytest.mark.stress
def test_a_client_that_does_not_read_holds_everything_to_a_bound(
    gw: Gateway, tmp_path: Path
) -> None:
    counter = tmp_path / "produced"
    rss_before = _rss_kib(gw.popen.pid)
    size = 64 * 1024
    sock = _open_stream(gw, "flood", str(counter), size)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    try:
        # The generator would run forever; held by the reader, it stops.
        last = [-1]

        def settled() -> bool:
            now = int(counter.read_text() or 0) if counter.exists() else 0
            same, last[0] = now == last[0], now
            return same and now > 0

        wait_for(settled, 30, "the producer stopped", interval=1.5)
        produced = last[0]
        # Socket buffers, the server's write buffer and the stream's window: a
        # few hundred 64 KiB items at most, never the unbounded flood.
        assert produced < 1500, produced
        grown = _rss_kib(gw.popen.pid) - rss_before
        assert grown < 100 * 1024, f"the gateway grew {grown} KiB"
        # Reading again lets it go on.
        _read_until(sock, b"\n\n", 50)
        wait_for(lambda: int(counter.read_text() or 0) > produced, 20, "the producer resumed")
    finally:
        sock.close()
    assert gw.call("model", "add", 2, 2) == 4


def test_no_healthy_replica_is_503_with_retry_after(gw: Gateway) -> None:
    # tiny has one replica; killed, it is respawned slowly (5 s) meanwhile.
    pid = gw.call("tiny", "pid")
    slow = gw.dir / "slow-start"
    slow.write_text("")
    try:
        os.kill(pid, signal.SIGKILL)

        def refused() -> tuple[int, dict[str, str], dict[str, object]] | None:
            got = gw.request("POST", "/v1/tiny/nap", {"args": [0]}, {"X-Zmesh-Timeout": "0.3"})
            return got if got[0] == 503 else None

        _, headers, doc = wait_for(refused, 10, "a 503 while no replica is healthy")
        assert headers["retry-after"] == "1"
        # Recovering, with no queue to wait in (max_queue=0): overloaded, a ServiceError.
        assert doc["error"]["type"] in ("ServiceError", "ServiceOverloadedError"), doc  # type: ignore[index]
    finally:
        slow.unlink()

    def back() -> bool:
        status, _, doc = gw.request("POST", "/v1/tiny/pid", {})
        return status == 200 and doc["result"] != pid

    wait_for(back, 60, "tiny respawned", interval=0.2)


@pytest.mark.stress
def test_many_clients_that_vanish_mid_stream_close_every_generator(
    gw: Gateway, tmp_path: Path
) -> None:
    n = 60
    rss_before = _rss_kib(gw.popen.pid)
    socks = [_open_stream(gw, "forever", str(tmp_path / f"closed-{i}")) for i in range(n)]
    try:
        for s in socks:
            _read_until(s, b"\n\n", 1)  # each stream runs in a replica
    finally:
        for s in socks:
            s.close()
    wait_for(
        lambda: all((tmp_path / f"closed-{i}").exists() for i in range(n)),
        30,
        "every generator closed in its replica",
    )
    grown = _rss_kib(gw.popen.pid) - rss_before
    assert grown < 50 * 1024, f"the gateway grew {grown} KiB"
    assert gw.call("model", "add", 3, 4) == 7

"""AsyncSocket's sends on real ZeroMQ sockets: a bad part never corrupts the stream."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
import zmq

from zmesh._wire.zsock import HWM, MAX_MSG_SIZE, AsyncSocket, configure

from _helpers import end_child, read_line

pytestmark = pytest.mark.anyio


async def test_a_part_that_cannot_be_sent_is_refused_before_any_part_goes() -> None:
    ctx: zmq.Context[Any] = zmq.Context.instance()
    server = configure(ctx.socket(zmq.ROUTER))
    server.bind("tcp://127.0.0.1:*")
    dealer = configure(ctx.socket(zmq.DEALER))
    dealer.connect(server.getsockopt_string(zmq.LAST_ENDPOINT))
    client = AsyncSocket(dealer, asyncio.get_running_loop(), None)
    try:
        strided = memoryview(bytearray(b"0123456789"))[::2]  # no one block to send
        with pytest.raises(BufferError):
            client.send([b"head", strided])
        client.send([b"next", b"intact"])
        assert server.poll(5000)
        # Nothing of the refused message went out, so the next one arrives
        # whole and alone, not glued onto a half-sent one.
        assert server.recv_multipart()[1:] == [b"next", b"intact"]
        assert not server.poll(200)
    finally:
        client.close()
        server.close(linger=0)


async def test_a_paused_socket_reads_nothing_until_resumed_and_loses_nothing() -> None:
    ctx: zmq.Context[Any] = zmq.Context.instance()
    loop = asyncio.get_running_loop()
    got: list[bytes] = []
    server = configure(ctx.socket(zmq.ROUTER), data=True)
    server.bind("tcp://127.0.0.1:*")
    reader = AsyncSocket(server, loop, lambda frames: got.append(frames[1]), router=True)
    dealer = configure(ctx.socket(zmq.DEALER), data=True)
    dealer.connect(server.getsockopt_string(zmq.LAST_ENDPOINT))
    try:
        reader.pause()
        for i in range(100):
            dealer.send(b"%d" % i)
        await asyncio.sleep(0.3)  # time enough to arrive; nothing is read
        assert got == []
        reader.resume()
        deadline = loop.time() + 5
        while len(got) < 100 and loop.time() < deadline:
            await asyncio.sleep(0.01)
        assert got == [b"%d" % i for i in range(100)]
    finally:
        reader.close()
        dealer.close(linger=0)


async def test_a_dropped_connection_is_reported_by_the_monitor() -> None:
    ctx: zmq.Context[Any] = zmq.Context.instance()
    loop = asyncio.get_running_loop()
    server = configure(ctx.socket(zmq.ROUTER), data=True)
    server.bind("tcp://127.0.0.1:*")
    dealer = configure(ctx.socket(zmq.DEALER), data=True)
    dealer.connect(server.getsockopt_string(zmq.LAST_ENDPOINT))
    client = AsyncSocket(dealer, loop, None)
    dropped = asyncio.Event()
    client.watch_disconnects(dropped.set)
    try:
        client.send([b"hello"])
        assert server.poll(5000)
        server.recv_multipart()
        server.close(linger=0)  # the peer goes away
        await asyncio.wait_for(dropped.wait(), 5)
    finally:
        client.close()


def test_call_sockets_have_no_zmtp_heartbeats_and_control_sockets_do() -> None:
    ctx: zmq.Context[Any] = zmq.Context.instance()
    data = configure(ctx.socket(zmq.DEALER), data=True)
    control = configure(ctx.socket(zmq.DEALER))
    tcp = configure(ctx.socket(zmq.DEALER), addr="tcp://10.0.0.2:5555")
    try:
        assert data.getsockopt(zmq.HEARTBEAT_IVL) == 0
        assert data.getsockopt(zmq.TCP_KEEPALIVE) == 1
        for s in (control, tcp):
            assert s.getsockopt(zmq.HEARTBEAT_IVL) == 100
            assert s.getsockopt(zmq.HEARTBEAT_TIMEOUT) == 500
        for s in (data, control, tcp):
            assert s.getsockopt(zmq.MAXMSGSIZE) == MAX_MSG_SIZE
            assert s.getsockopt(zmq.RCVHWM) == HWM
    finally:
        for s in (data, control, tcp):
            s.close(linger=0)


def test_control_sockets_on_links_within_the_machine_have_no_zmtp_heartbeats() -> None:
    ctx: zmq.Context[Any] = zmq.Context.instance()
    for addr in ("ipc:///run/agent/c", "inproc://events"):
        sock = configure(ctx.socket(zmq.SUB), addr=addr)
        try:
            assert sock.getsockopt(zmq.HEARTBEAT_IVL) == 0
            assert sock.getsockopt(zmq.RCVHWM) == HWM  # the rest as on any control socket
        finally:
            sock.close(linger=0)


async def test_a_shared_socket_sends_from_another_thread_and_reads_on() -> None:
    ctx: zmq.Context[Any] = zmq.Context.instance()
    loop = asyncio.get_running_loop()
    got: asyncio.Queue[list[Any]] = asyncio.Queue()
    router = configure(ctx.socket(zmq.ROUTER))
    router.bind("tcp://127.0.0.1:*")
    server = AsyncSocket(router, loop, got.put_nowait, router=True, batch=True)
    server.share()
    dealer = configure(ctx.socket(zmq.DEALER))
    dealer.connect(router.getsockopt_string(zmq.LAST_ENDPOINT))
    try:
        dealer.send(b"one")
        ident, body = await asyncio.wait_for(got.get(), 5)
        assert body == b"one"
        sent = await asyncio.to_thread(server.send_from_thread, [ident, b"back"], lambda: True)
        refused = await asyncio.to_thread(server.send_from_thread, [ident, b"no"], lambda: False)
        assert (sent, refused) == (True, False)  # a failed claim sends nothing
        assert dealer.poll(5000) and dealer.recv() == b"back"
        assert not dealer.poll(200)
        server.recheck()  # (as the loop does after a send from the thread)
        dealer.send(b"two")
        assert (await asyncio.wait_for(got.get(), 5))[1] == b"two"
    finally:
        server.close()
        dealer.close(linger=0)


async def test_a_send_from_another_thread_that_takes_the_edge_wakes_the_loop() -> None:
    # ZMQ_FD is edge-triggered: the thread's send processes the socket's
    # pending commands, a message's arrival among them, and the loop's
    # descriptor goes quiet. Input waiting after the send must wake the loop.
    ctx: zmq.Context[Any] = zmq.Context.instance()
    loop = asyncio.get_running_loop()
    got: asyncio.Queue[list[Any]] = asyncio.Queue()
    router = configure(ctx.socket(zmq.ROUTER))
    router.bind("tcp://127.0.0.1:*")
    server = AsyncSocket(router, loop, got.put_nowait, router=True, batch=True)
    server.share()
    dealer = configure(ctx.socket(zmq.DEALER))
    dealer.connect(router.getsockopt_string(zmq.LAST_ENDPOINT))
    try:
        dealer.send(b"one")
        ident, _ = await asyncio.wait_for(got.get(), 5)
        sent = threading.Event()

        def answer() -> None:
            time.sleep(0.3)  # "two" has arrived by now; the loop is held
            server.send_from_thread([ident, b"back"], lambda: True)
            sent.set()

        thread = threading.Thread(target=answer)
        thread.start()
        dealer.send(b"two")
        sent.wait(10)  # holds the loop's thread, so only the thread touches the socket
        thread.join()
        assert (await asyncio.wait_for(got.get(), 3))[1] == b"two"
    finally:
        server.close()
        dealer.close(linger=0)


# A peer that binds ``addr`` and sends until ZeroMQ holds no more (the other
# end reads nothing), then dies at once (as an agent killed -9 would).
_FLOOD = """
import os, signal, sys, time, zmq
sock = zmq.Context.instance().socket(zmq.DEALER)
sock.bind(sys.argv[1])
print("bound", flush=True)
sent, since = 0, None
while not sent or since is None or time.monotonic() - since < 0.05:
    try:
        sock.send(b"x", zmq.NOBLOCK)
        sent, since = sent + 1, None
    except zmq.Again:
        since = since or time.monotonic()
        time.sleep(0.001)
os.kill(os.getpid(), signal.SIGKILL)
"""

# A control socket made by zmesh on ``addr`` that reads nothing; once told
# its peer is dead, it lives on for ten ZMTP heartbeat intervals. Its small
# receive pipe fills at once: it stands for every state in which libzmq stops
# reading a connection (a full pipe, a socket being closed).
_STILL = """
import sys, time, zmq
from zmesh._wire.zsock import configure
addr = sys.argv[1]
sock = configure(zmq.Context.instance().socket(zmq.DEALER), addr=addr)
sock.setsockopt(zmq.RCVHWM, 100)
sock.connect(addr)
print("ready", flush=True)
sys.stdin.readline()
time.sleep(1.0)
print("alive", flush=True)
sock.close(linger=0)
"""


@pytest.mark.slow
def test_a_control_socket_on_ipc_outlives_its_peer_when_its_input_is_full(tmp_path: Any) -> None:
    # libzmq 4.3.5 aborts the process (``!_io_error``, stream_engine_base.cpp)
    # when a ZMTP heartbeat falls due on a connection that stopped reading
    # (a full pipe, or a socket being closed) after its peer hung up. On ipc
    # the kernel says at once that a peer died: no heartbeat, no abort.
    addr = f"ipc://{tmp_path}/peer"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    peer = subprocess.Popen(
        [sys.executable, "-c", _FLOOD, addr], stdout=subprocess.PIPE, text=True, env=env
    )
    client = None
    try:
        assert read_line(peer, 30).strip() == "bound"
        client = subprocess.Popen(
            [sys.executable, "-c", _STILL, addr], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert read_line(client, 30).strip() == "ready"
        assert peer.wait(60) == -signal.SIGKILL  # it filled the client's pipe, then died
        assert client.stdin is not None
        client.stdin.write("go\n")
        client.stdin.flush()
        out, err = client.communicate(timeout=30)
        assert client.returncode == 0, f"rc={client.returncode} stderr={err!r}"
        assert out.strip() == "alive"
    finally:
        peer.kill()
        end_child(peer)
        if client is not None:
            client.kill()
            end_child(client)

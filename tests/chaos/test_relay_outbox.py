"""What a relay sends before its connection to a proc is up, at ten times a normal burst.

A relay reaches its host's procs on connections it makes when a sender's
first fan-out needs them (``zmesh._host.proc.relay``), and sends at once:
what it sends waits in ZeroMQ until the connection is up (its *outbox*).
Here that is attacked three ways:

* a burst of fan-outs to a mesh just spawned, so nearly all of it is sent
  before the relay's connections are up: every call is answered and every
  broadcast runs, in the order sent;
* many senders at once, each new to the relay, each with a burst: the
  same;
* a proc that cannot take its connection (stopped) while a burst is
  queued for it, then killed (``kill -9``, or by its agent, which fails a
  stopped proc for its missed heartbeats): every call fails with
  ``SupervisionError`` naming it, none hangs, and the rest of the mesh
  goes on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

import pytest
import zmq

import zmesh
from zmesh._client.calls import tree as _tree
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec

from _helpers import wait_gone

pytestmark = [pytest.mark.chaos, pytest.mark.stress, pytest.mark.slow]

PROCS = 4  # on one host: rank 0 is the relay, ranks 1-3 its links' targets
BURST = 200  # fan-outs in one burst (a normal burst: a few to twenty)
SENDERS = 8


class Seq(zmesh.Actor):
    def __init__(self) -> None:
        self.notes: list[Any] = []

    @zmesh.endpoint
    async def note(self, n: Any) -> None:
        self.notes.append(n)

    @zmesh.endpoint
    async def seen(self) -> list[Any]:
        return list(self.notes)

    @zmesh.endpoint
    async def echo(self, n: int) -> int:
        return n

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()


@pytest.fixture(autouse=True)
def through_relays(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every fan-out through the relay, however small the mesh.
    monkeypatch.setattr(_tree, "MODE", "tree")


def outcomes(futs: list[zmesh.Future[Any]], timeout: float) -> list[tuple[bool, Any]]:
    """Each future's (ok, value or exception), all within ``timeout`` s in total."""
    deadline = time.monotonic() + timeout
    out: list[tuple[bool, Any]] = []
    for f in futs:
        try:
            out.append((True, f.get(timeout=max(0.1, deadline - time.monotonic()))))
        except Exception as exc:
            out.append((False, exc))
    return out


def test_a_burst_sent_before_the_relays_connections_are_up_all_arrives_in_order() -> None:
    mesh = Seq.options(procs=PROCS).as_actor().get(timeout=60)
    # The first fan-out makes the relay's connections; the rest of the burst
    # is sent on them at once, before they are up.
    futs = []
    for n in range(BURST):
        mesh.note.broadcast(n)
        futs.append(mesh.echo.call(n))
    got = outcomes(futs, 60)
    assert [(ok, v.values() if ok else v) for ok, v in got] == [
        (True, [n] * PROCS) for n in range(BURST)
    ]
    assert mesh.seen.call().get(timeout=30).values() == [list(range(BURST))] * PROCS
    mesh.stop().get(timeout=30)


def one_sender(mesh: zmesh.ActorMesh[Seq], codec: Codec, who: int) -> zmq.Socket[bytes]:
    """A sender new to the relay: a burst of ``Relay``s to ranks 1-3, sent at once."""
    relay = mesh._refs[0]
    targets = [w.RelayTarget(r.rank, r.generation, r.addr) for r in mesh._refs[1:]]
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(relay.addr)
    for n in range(BURST):
        body = codec.encode(w.Call(n + 1, mesh.actor, "note", w.Payload(((who, n),))))[0]
        sock.send_multipart(codec.encode(w.Relay(n + 1, relay.mesh, targets, body)))
    return sock


def test_many_new_senders_bursting_at_once_lose_nothing_and_keep_order() -> None:
    mesh = Seq.options(procs=PROCS).as_actor().get(timeout=60)
    codec = Codec(w.CLIENT_INBOX)
    socks = [one_sender(mesh, codec, who) for who in range(SENDERS)]
    try:
        # Every Relay's three answers come back (each a Reply, passed on undecoded).
        for sock in socks:
            answered: dict[int, int] = {}
            deadline = time.monotonic() + 60
            while sum(answered.values()) < BURST * (PROCS - 1):
                assert time.monotonic() < deadline, f"{sum(answered.values())} answers"
                if not sock.poll(200):
                    continue
                for msg in codec.decode_frames(sock.recv_multipart()):
                    assert isinstance(msg, w.RelayReply), msg
                    assert not msg.lost, msg
                    for raw in msg.answers:
                        assert isinstance(codec.decode([bytes(raw)]), w.Reply)
                    answered[msg.id] = answered.get(msg.id, 0) + len(msg.answers)
            assert answered == {n + 1: PROCS - 1 for n in range(BURST)}
    finally:
        for sock in socks:
            sock.close()
    seen = mesh.slice(procs=slice(1, PROCS)).seen.call().get(timeout=30).values()
    for notes in seen:  # each sender's notes, all there, in its order
        for who in range(SENDERS):
            assert [n for s, n in notes if s == who] == list(range(BURST))
    mesh.stop().get(timeout=30)


def test_a_proc_killed_with_a_burst_queued_for_it_fails_those_calls_typed() -> None:
    mesh = Seq.options(procs=PROCS).as_actor().get(timeout=60)
    victim = 2
    pid = mesh.slice(procs=victim).pid.call_one().get(timeout=30)
    # Stopped, it cannot take the relay's connection: the relay's part for
    # it waits in the relay's outbox (the other ranks get theirs).
    os.kill(pid, signal.SIGSTOP)
    try:
        futs = [mesh.echo.call(n) for n in range(BURST)]
        for n in range(BURST):
            mesh.note.broadcast(n)
        others = mesh.slice(procs=slice(0, victim)).seen
        # (The relay's own rank saw the burst: it has been forwarded.)
        deadline = time.monotonic() + 30
        while len(others.call().get(timeout=30).values()[0]) < BURST:
            assert time.monotonic() < deadline, "the burst did not reach the relay"
            time.sleep(0.05)
    finally:
        # (Its agent may have killed it first: a stopped proc misses its
        # heartbeats and is failed as ``Timeout`` within a second.)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    got = outcomes(futs, 20)
    took = time.monotonic() - t0
    assert all(not ok for ok, _ in got), [v for ok, v in got if ok][:3]
    for _, err in got:
        assert isinstance(err, zmesh.SupervisionError) and err.rank == victim, err
    assert took < 10, f"the calls took {took:.1f} s to fail"
    wait_gone([pid], 10, "the killed proc")
    # The rest of the mesh goes on through the same relay.
    assert mesh.slice(procs=slice(0, victim)).echo.call(7).get(timeout=30).values() == [7, 7]
    assert mesh.slice(procs=victim + 1).echo.call(8).get(timeout=30).values() == [8]
    with pytest.raises(zmesh.SupervisionError):
        mesh.echo.call(9).get(timeout=30)

"""A relay used by many senders over its life keeps its file descriptors bounded.

A relay gives each sender its own connection (a *link*) to each target, so
one sender's messages keep their order (``zmesh._host.proc.relay``). Senders
come and go: every client script, every reconnection is a new routing
identity at the relay. A detached mesh serves many scripts for days, so the
links of senders that left must not pile up: here 200 senders, one after
the other, each send one ``Relay`` through the same relay, are answered,
and close. The relay proc must still answer, with about as many fds as
after the first (links idle for ``ZMESH_RELAY_LINK_IDLE`` s are closed as
new ones are made; before that, each sender that left cost the relay 4 fds).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

import zmesh
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec

pytestmark = pytest.mark.stress

SENDERS = 200
IDLE = 0.05


class Echo(zmesh.Actor):
    @zmesh.endpoint
    async def ping(self, x: int) -> int:
        return x

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()


@pytest.fixture(scope="module")
def pair() -> Iterator[zmesh.ActorMesh[Echo]]:
    # Links idle for IDLE s go (10 s by default: too long to wait for here).
    # ZMESH_* variables reach the procs.
    before = os.environ.get("ZMESH_RELAY_LINK_IDLE")
    os.environ["ZMESH_RELAY_LINK_IDLE"] = str(IDLE)
    try:
        mesh = Echo.options(procs=2).as_actor().get(timeout=60)
    finally:
        if before is None:
            del os.environ["ZMESH_RELAY_LINK_IDLE"]
        else:
            os.environ["ZMESH_RELAY_LINK_IDLE"] = before
    try:
        yield mesh
    finally:
        mesh.stop().get(timeout=30)


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def one_sender(mesh: zmesh.ActorMesh[Any], codec: Codec, i: int) -> None:
    """A new sender: one Relay through rank 0 to rank 1, answered, then gone."""
    relay, target = mesh._refs[0], mesh._refs[1]
    body = codec.encode(w.Call(i, mesh.actor, "ping", w.Payload((i,))))[0]
    targets = [w.RelayTarget(target.rank, target.generation, target.addr)]
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(relay.addr)
    try:
        sock.send_multipart(codec.encode(w.Relay(i, relay.mesh, targets, body)))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if sock.poll(200):
                for msg in codec.decode_frames(sock.recv_multipart()):
                    if isinstance(msg, w.RelayReply) and msg.answers:
                        (raw,) = msg.answers  # the proc's envelope, passed on undecoded
                        answer = codec.decode([bytes(raw)])
                        assert isinstance(answer, w.Reply), answer
                        return
        raise AssertionError(f"sender {i}: no answer through the relay")
    finally:
        sock.close()


def test_senders_that_left_leave_no_links_behind(pair: zmesh.ActorMesh[Echo]) -> None:
    codec = Codec(w.CLIENT_INBOX)
    relay_pid = pair.slice(procs=0).pid.call_one().get(timeout=10)
    for i in range(3):  # warm: the relay's agent client, its first links
        one_sender(pair, codec, i + 1)
    before = fds(relay_pid)
    for i in range(SENDERS):
        one_sender(pair, codec, 100 + i)
        time.sleep(IDLE / 5)  # (a few senders at a time are within IDLE of each other)
    after = fds(relay_pid)
    print(f"relay fds: {before} after 3 senders, {after} after {SENDERS} more")
    assert after - before < 50, f"{after - before} fds more after {SENDERS} senders left"
    assert pair.slice(procs=0).ping.call_one(5).get(timeout=10) == 5

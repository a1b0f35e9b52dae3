"""A relay runs its own proc's part of a ``Relay`` itself, with no link to itself.

Raw ``Relay`` messages to rank 0 of a 2-proc mesh, each from a new sender
(a DEALER, as a client's connection is), read back as a client would:
the relay's own answer comes gathered with the other target's, an actor of
its own that raises or is missing fails exactly its index, and no sender
costs the relay a connection to itself (before, each new sender's first
``Relay`` made a link from the relay to its own ROUTER: 4 more fds).
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

from _helpers import keep_module_meshes  # noqa: F401  (a fixture: the mesh outlives tests)
from _keptagents import stop_meshes

pytestmark = pytest.mark.slow

SENDERS = 12


class Own(zmesh.Actor):
    @zmesh.endpoint
    async def ping(self, x: int) -> list[int]:
        return [zmesh.current_rank().rank, x]

    @zmesh.endpoint
    async def boom(self, x: int) -> int:
        if zmesh.current_rank().rank == 0:  # the relay's own actor
            raise ValueError(f"boom {x}")
        return x

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()


@pytest.fixture(scope="module")
def pair() -> Iterator[zmesh.ActorMesh[Own]]:
    mesh = Own.options(procs=2).as_actor().get(timeout=60)
    yield mesh
    stop_meshes()


def relay_through_rank_0(
    mesh: zmesh.ActorMesh[Any], ranks: list[int], actor: str, method: str, x: int
) -> dict[int, Any]:
    """A new sender's ``Relay`` through rank 0 to ``ranks``: each index's decoded answer."""
    codec = Codec(w.CLIENT_INBOX)
    relay = mesh._refs[0]
    body = codec.encode(w.Call(x, actor, method, w.Payload((x,))))[0]
    refs = [mesh._refs[r] for r in ranks]
    targets = [w.RelayTarget(t.rank, t.generation, t.addr) for t in refs]
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(relay.addr)
    answers: dict[int, Any] = {}
    try:
        sock.send_multipart(codec.encode(w.Relay(x, relay.mesh, targets, body)))
        deadline = time.monotonic() + 15
        while len(answers) < len(ranks) and time.monotonic() < deadline:
            if sock.poll(200):
                frames = sock.recv_multipart()
                for msg in codec.decode_frames(frames):
                    if isinstance(msg, w.RelayReply):
                        pos = 0
                        for k, raw, n in zip(msg.index, msg.answers, msg.nbufs, strict=False):
                            answers[k] = codec.decode([bytes(raw), *frames[1 + pos : 1 + pos + n]])
                            pos += n
    finally:
        sock.close()
    assert sorted(answers) == list(range(len(ranks))), f"answered: {sorted(answers)}"
    return answers


def value(codec: Codec, reply: Any) -> Any:
    assert isinstance(reply, w.Reply), reply
    return codec.unpack_value(reply.payload, [b""])


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_the_relays_own_part_is_answered_with_no_link_to_itself(
    pair: zmesh.ActorMesh[Own],
) -> None:
    codec = Codec(w.CLIENT_INBOX)
    relay_pid = pair.slice(procs=0).pid.call_one().get(timeout=10)
    # Warm: the relay's agent client, its link to rank 1 for this sender.
    both = relay_through_rank_0(pair, [0, 1], pair.actor, "ping", 1)
    assert [value(codec, both[k]) for k in (0, 1)] == [[0, 1], [1, 1]]
    before = fds(relay_pid)
    for i in range(SENDERS):  # each a new sender, through rank 0 to rank 0 alone
        (own,) = relay_through_rank_0(pair, [0], pair.actor, "ping", 100 + i).values()
        assert value(codec, own) == [0, 100 + i]
    after = fds(relay_pid)
    # A link to itself per sender was 4 fds each (48 here); none is made now.
    assert after - before < SENDERS, f"{after - before} fds more after {SENDERS} senders"


def test_the_relays_own_actor_raising_or_missing_fails_exactly_its_index(
    pair: zmesh.ActorMesh[Own],
) -> None:
    codec = Codec(w.CLIENT_INBOX)
    got = relay_through_rank_0(pair, [0, 1], pair.actor, "boom", 7)
    assert isinstance(got[0], w.Failure) and got[0].type == "ValueError", got[0]
    assert "boom 7" in got[0].message and got[0].endpoint == "boom"
    assert value(codec, got[1]) == 7
    # A name its proc has no actor of: that index alone fails, as on the direct path.
    missing = relay_through_rank_0(pair, [0, 1], "nobody-here", "ping", 8)
    assert all(isinstance(a, w.Failure) and a.type == "ActorStopped" for a in missing.values())
    # The relay's proc goes on serving, directly and through itself.
    assert pair.slice(procs=0).ping.call_one(9).get(timeout=10) == [0, 9]
    assert value(codec, relay_through_rank_0(pair, [0], pair.actor, "ping", 10)[0]) == [0, 10]

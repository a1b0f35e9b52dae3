"""CreateOrUpdate with a changed spec updates a running mesh in place.

Against a real agent, on the wire (as a controller speaks to it): growing a
mesh starts the new ranks and leaves the others running, shrinking stops
the ranks left out (their Stopping and Stopped events carry their
generation) and drops them from ``GetState``, and a changed proc spec rolls
every rank to a new generation. The mesh's generation goes up with each
update, and reusing a stopped name goes on from its generations.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from zmesh import testing
from zmesh._shared import ownership
from zmesh._shared.state import Status
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec

from _helpers import wait_for, wait_gone

SECRET = "s3cret"
OWNER = ownership.owner_id("test", 1, SECRET)  # an owner id is made from its secret


class Wire:
    """A controller's two sockets on one agent: requests, and its event stream."""

    def __init__(self, agent: testing.AgentProcess) -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.req = ctx.socket(zmq.DEALER)
        self.req.setsockopt(zmq.LINGER, 0)
        self.req.connect(agent.control)
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(agent.stream)
        self.ids = 0
        self.events: list[w.Event] = []
        self._send, self._reply, self._stream = (
            Codec(w.AGENT_INBOX), Codec(w.AGENT_REPLIES), Codec(w.STREAM)
        )  # fmt: skip
        # The agent's welcome says the subscription is live: no event is missed.
        assert self.sub.poll(10_000), "no welcome on the agent's stream"
        self._drain(0)

    def ask(self, make: Any) -> Any:
        self.ids += 1
        self.req.send_multipart(self._send.encode(make(self.ids)))
        assert self.req.poll(10_000), "no answer from the agent"
        return self._reply.decode(self.req.recv_multipart())

    def create(self, name: str, ranks: list[int], env: dict[str, str] | None = None) -> None:
        spec = w.ProcSpec(OWNER, ranks, {"procs": max(ranks) + 1}, env=env or {})
        ack = self.ask(lambda i: w.CreateOrUpdate(i, name, spec, secret=SECRET))
        assert isinstance(ack, w.Ack) and ack.ok, ack

    def state(self, name: str) -> w.MeshReport:
        (mesh,) = self.ask(lambda i: w.GetState(i, name)).meshes
        return mesh

    def running(self, name: str, ranks: list[int]) -> w.MeshReport:
        def ready() -> w.MeshReport | None:
            m = self.state(name)
            ok = [r.rank for r in m.ranks] == ranks and all(
                r.status == Status.RUNNING for r in m.ranks
            )
            return m if ok else None

        return wait_for(ready, 60, f"{name} ranks {ranks} Running", interval=0.1)

    def _drain(self, wait: float) -> None:
        while self.sub.poll(int(wait * 1000)):
            msg = self._stream.decode(self.sub.recv_multipart())
            if isinstance(msg, w.Event):
                self.events.append(msg)
            wait = 0

    def seen(self, name: str, rank: int) -> list[tuple[Status, int]]:
        self._drain(0.05)
        return [(e.state.status, e.state.generation) for e in self.events
                if e.mesh == name and e.state.rank == rank]  # fmt: skip

    def has(self, name: str, rank: int, event: tuple[Status, int]) -> bool:
        """Whether ``rank`` of mesh ``name`` has entered ``(status, generation)``."""
        return event in self.seen(name, rank)

    def close(self) -> None:
        self.req.close()
        self.sub.close()


@pytest.fixture
def wire() -> Iterator[Wire]:
    agent = testing.start_agent("update")
    wire = Wire(agent)
    try:
        yield wire
    finally:
        wire.close()
        testing.stop_agent(agent)


def test_a_mesh_grows_shrinks_and_rolls_in_place(wire: Wire) -> None:
    wire.create("workers", [0, 1])
    before = wire.running("workers", [0, 1])
    assert before.generation == 1
    pids = {r.rank: r.pid for r in before.ranks}

    wire.create("workers", [0, 1, 2, 3])  # grow 2 -> 4: the first two keep running
    grown = wire.running("workers", [0, 1, 2, 3])
    assert grown.generation == 2 and grown.dims == {"procs": 4}
    assert {r.rank: r.pid for r in grown.ranks if r.rank < 2} == pids
    assert all(r.generation == 1 for r in grown.ranks)

    wire.create("workers", [0, 1])  # shrink 4 -> 2: ranks 2 and 3 stop and leave
    shrunk = wire.running("workers", [0, 1])
    assert shrunk.generation == 3 and {r.rank: r.pid for r in shrunk.ranks} == pids
    gone = [r.pid for r in grown.ranks if r.rank >= 2]
    wait_gone(gone, 20, "the ranks the mesh shrank away from")
    for rank in (2, 3):
        wait_for(functools.partial(wire.has, "workers", rank, (Status.STOPPED, 1)), 10, "Stopped")
        assert (Status.STOPPING, 1) in wire.seen("workers", rank)

    wire.create("workers", [0, 1], env={"ZMESH_TEST_ROLL": "2"})  # a changed proc spec: roll
    rolled = wait_for(
        lambda: (m := wire.running("workers", [0, 1])) and
        all(r.generation == 2 for r in m.ranks) and m,
        60, "every rank in generation 2",
    )  # fmt: skip
    assert rolled.generation == 4 and not {r.pid for r in rolled.ranks} & set(pids.values())
    for rank in (0, 1):
        wait_for(functools.partial(wire.has, "workers", rank, (Status.RUNNING, 2)), 10, "g2")
        assert [s for s in wire.seen("workers", rank) if s[1] == 1][-2:] == [
            (Status.STOPPING, 1), (Status.STOPPED, 1)
        ]  # fmt: skip

    ack = wire.ask(lambda i: w.Stop(i, "workers", secret=SECRET))
    assert ack.ok
    wait_for(lambda: wire.state("workers").status == Status.STOPPED, 20, "the mesh Stopped")
    wire.create("workers", [0, 1])  # the name again: on from its generations
    again = wait_for(
        lambda: (m := wire.running("workers", [0, 1])) and m, 60, "the new mesh Running"
    )
    assert again.generation == 5 and all(r.generation == 3 for r in again.ranks)
    assert wire.ask(lambda i: w.Stop(i, "workers", secret=SECRET)).ok

"""One actor of a proc blocked in a sync endpoint must not hold its siblings.

With ``actors_per_proc``, a fan-out of a sync endpoint runs the idle actors'
parts one after the other in one worker thread while each is short
(``zmesh._host.proc.groupfast``), each actor held busy until its part has run. An
actor whose part blocks (a long load, a wait on an event, a barrier with
its siblings) must not keep the parts queued behind it waiting, nor the
other calls to those siblings: each actor runs in its own thread, as
through its mailbox. Fresh endpoints each (the fast path is given up for
an endpoint once one of its parts was slow).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

import zmesh

pytestmark = pytest.mark.stress

PER = 4
BLOCK = 3.0
_barrier = threading.Barrier(PER, timeout=BLOCK)  # in each proc: its own actors


class Group(zmesh.Actor):
    @zmesh.endpoint
    def load(self, slow: int) -> int:
        rank = zmesh.current_rank().rank
        if rank == slow:
            time.sleep(BLOCK)  # a long load, in one actor only
        return rank

    @zmesh.endpoint
    def meet(self) -> int:
        _barrier.wait()  # every actor of the proc at once, or BrokenBarrierError
        return zmesh.current_rank().rank

    @zmesh.endpoint
    async def who(self) -> int:
        return zmesh.current_rank().rank


@pytest.fixture
def group() -> Iterator[zmesh.ActorMesh[Group]]:
    mesh = Group.options(procs=1, actors_per_proc=PER).as_actor().get(timeout=60)
    try:
        assert mesh.who.call().get(timeout=10).values() == list(range(PER))
        yield mesh
    finally:
        mesh.stop().get(timeout=30)


def test_a_blocked_part_does_not_hold_its_siblings_calls(group: zmesh.ActorMesh[Group]) -> None:
    fan = group.load.call(0)
    time.sleep(0.3)  # actor 0 is asleep in its part
    for k in range(1, PER):
        t0 = time.monotonic()
        assert group.slice(actors=k).who.call_one().get(timeout=10) == k
        took = time.monotonic() - t0
        assert took < 1.0, f"actor {k} answered after {took:.1f}s: held behind actor 0"
    assert fan.get(timeout=10).values() == list(range(PER))


def test_siblings_that_wait_for_each_other_in_a_sync_endpoint_meet(
    group: zmesh.ActorMesh[Group],
) -> None:
    t0 = time.monotonic()
    assert group.meet.call().get(timeout=BLOCK + 10).values() == list(range(PER))
    assert time.monotonic() - t0 < BLOCK

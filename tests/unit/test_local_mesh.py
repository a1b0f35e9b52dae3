"""``zmesh.testing.local_mesh``: actors in this process, with a real mesh's adverbs and errors.

The same calls, values and exception types as ``tests/integration/test_adverbs.py``
and ``test_errors.py`` see from real procs, without a process or a socket.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import zmesh
from zmesh.testing import LocalMesh, local_mesh

pytestmark = pytest.mark.anyio


class Counter(zmesh.Actor):
    def __init__(self, start: int = 0) -> None:
        self.n = start
        self.log: list[int] = []

    @zmesh.endpoint
    async def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n

    @zmesh.endpoint
    def rank(self) -> int:  # sync: runs in a worker thread
        assert threading.current_thread() is not threading.main_thread()
        return zmesh.current_rank().rank

    @zmesh.endpoint
    async def where(self) -> dict[str, int]:
        return zmesh.current_rank().coords

    @zmesh.endpoint
    async def note(self, i: int) -> None:
        await asyncio.sleep(0.001 * (i % 3))  # one at a time: order holds anyway
        self.log.append(i)

    @zmesh.endpoint
    async def notes(self) -> list[int]:
        return self.log

    @zmesh.endpoint
    async def keep(self, items: list[int]) -> list[int]:
        items.append(99)  # the caller's list must not change: it got a copy
        return items

    @zmesh.endpoint
    async def fail(self) -> None:
        raise ValueError("no")

    @zmesh.endpoint
    async def nap(self, seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    @zmesh.endpoint(concurrent=True)
    async def meet(self, n: int, hold: float) -> int:
        self.n += 1
        deadline = time.monotonic() + hold
        while self.n < n and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        return self.n

    @zmesh.endpoint
    async def unsendable(self) -> Any:
        return threading.Lock()

    @zmesh.endpoint
    async def leave(self) -> None:
        raise SystemExit(3)

    @zmesh.endpoint
    async def give_up(self) -> None:
        raise asyncio.CancelledError("of its own")

    @zmesh.endpoint
    def interrupt(self) -> None:
        raise KeyboardInterrupt("pressed")


class Summer(zmesh.Actor):
    """Holds another local mesh and calls it, as an actor holds a real mesh handle."""

    def __init__(self, counters: LocalMesh[Counter]) -> None:
        self.counters = counters

    @zmesh.endpoint
    async def total(self) -> int:
        return sum((await self.counters.rank.call()).values())

    @zmesh.endpoint
    def total_sync(self) -> int:
        return sum(self.counters.rank.call().get(timeout=5).values())


class Broken(zmesh.Actor):
    def __init__(self) -> None:
        raise RuntimeError("no GPU")


@pytest.fixture
def mesh() -> Any:
    with local_mesh(Counter, 10, procs=4) as m:
        yield m


def test_call_and_call_one_sync(mesh: LocalMesh[Counter]) -> None:
    got = mesh.incr.call(1).get(timeout=5)
    assert isinstance(got, zmesh.ValueMesh)
    assert got.values() == [11, 11, 11, 11]
    assert [p.rank for p, _ in got.items()] == [0, 1, 2, 3]
    assert mesh.slice(procs=2).incr.call_one(5).get(timeout=5) == 16
    assert mesh.rank.call().get(timeout=5).values() == [0, 1, 2, 3]


async def test_adverbs_async(mesh: LocalMesh[Counter]) -> None:
    assert (await mesh.incr.call(2)).values() == [12] * 4
    assert await mesh.slice(procs=0).incr.call_one() == 13
    assert await mesh.incr.choose(0) in (12, 13)
    assert sorted([v async for v in mesh.rank.stream()]) == [0, 1, 2, 3]
    mesh.note.broadcast(7)
    assert (await mesh.notes.call()).values() == [[7]] * 4  # sent before: ran before


def test_stream_sync_replays(mesh: LocalMesh[Counter]) -> None:
    s = mesh.rank.stream()
    assert sorted(s) == [0, 1, 2, 3]
    assert sorted(s) == [0, 1, 2, 3]  # a second pass replays, as Stream does


def test_calls_from_one_sender_run_in_send_order(mesh: LocalMesh[Counter]) -> None:
    one = mesh.slice(procs=1)
    futs = [one.note.call_one(i) for i in range(50)]
    for f in futs:
        f.get(timeout=5)
    assert one.notes.call_one().get(timeout=5) == list(range(50))


def test_slices_and_points() -> None:
    with local_mesh(Counter, hosts=2, procs=3) as m:
        assert m.sizes == {"hosts": 2, "procs": 3} and len(m) == 6
        assert m.slice(hosts=1, procs=0).where.call_one().get(timeout=5) == {
            "hosts": 1,
            "procs": 0,
        }
        firsts = m.slice(procs=slice(0, 1))
        assert firsts.sizes == {"hosts": 2, "procs": 1}
        assert [p.rank for p in firsts.points()] == [0, 3]
        assert firsts.rank.call().get(timeout=5).values() == [0, 3]
        with pytest.raises(ValueError, match="exactly one actor"):
            m.rank.call_one()


def test_an_exception_in_an_endpoint_is_an_actor_error(mesh: LocalMesh[Counter]) -> None:
    with pytest.raises(zmesh.ActorError) as info:
        mesh.slice(procs=3).fail.call_one().get(timeout=5)
    err = info.value
    assert (err.remote_type, err.remote_message, err.endpoint, err.rank) == (
        "ValueError",
        "no",
        "fail",
        3,
    )
    assert isinstance(err.cause, ValueError) and "raise ValueError" in err.remote_traceback
    assert mesh.slice(procs=3).incr.call_one().get(timeout=5) == 11  # the actor lives on
    with pytest.raises(zmesh.ActorError):
        mesh.fail.call().get(timeout=5)  # one failure fails the whole call


def test_unknown_endpoints_and_bad_arguments_are_endpoint_errors(
    mesh: LocalMesh[Counter],
) -> None:
    with pytest.raises(zmesh.EndpointError, match="no endpoint 'nope'"):
        mesh.nope  # noqa: B018
    with pytest.raises(zmesh.EndpointError, match="bad arguments"):
        mesh.slice(procs=0).incr.call_one(1, 2, 3).get(timeout=5)


def test_values_travel_as_copies_and_unsendable_ones_fail(mesh: LocalMesh[Counter]) -> None:
    mine = [1, 2]
    assert mesh.slice(procs=0).keep.call_one(mine).get(timeout=5) == [1, 2, 99]
    assert mine == [1, 2]
    with pytest.raises(zmesh.EncodeError, match="cannot be sent"):
        mesh.slice(procs=0).keep.call_one(threading.Lock())  # at once, in the caller
    with pytest.raises(zmesh.EncodeError, match="return value"):
        mesh.slice(procs=0).unsendable.call_one().get(timeout=5)


async def test_a_timeout_is_a_call_timeout_error(mesh: LocalMesh[Counter]) -> None:
    t0 = time.monotonic()
    with pytest.raises(zmesh.CallTimeoutError) as info:
        await mesh.slice(procs=0).nap.options(timeout=0.1).call_one(10)
    assert isinstance(info.value, TimeoutError) and info.value.rank == 0
    assert time.monotonic() - t0 < 2.0
    with pytest.raises(zmesh.CallTimeoutError):  # from plain code too
        mesh.slice(procs=1).nap.options(timeout=0.1).call_one(10).get(timeout=5)


def test_concurrent_endpoints_overlap(mesh: LocalMesh[Counter]) -> None:
    one = mesh.slice(procs=0)
    futs = [one.meet.call_one(13, 5.0) for _ in range(3)]  # each waits for the others
    assert max(f.get(timeout=10) for f in futs) == 13


def test_a_killed_rank_fails_with_supervision_error(mesh: LocalMesh[Counter]) -> None:
    mesh.kill(2)
    with pytest.raises(zmesh.SupervisionError, match="killed by SIGKILL") as info:
        mesh.slice(procs=2).rank.call_one().get(timeout=5)
    assert info.value.rank == 2 and info.value.reason == "killed by SIGKILL"
    assert mesh.slice(procs=1).rank.call_one().get(timeout=5) == 1


def test_system_exit_answers_then_the_rank_is_gone(mesh: LocalMesh[Counter]) -> None:
    one = mesh.slice(procs=0)
    with pytest.raises(zmesh.ActorError, match="SystemExit"):
        one.leave.call_one().get(timeout=5)
    with pytest.raises(zmesh.SupervisionError, match="exited with code 3"):
        one.rank.call_one().get(timeout=5)


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [("give_up", "CancelledError: of its own"), ("interrupt", "KeyboardInterrupt: pressed")],
)
def test_a_base_exception_fails_its_rank_as_it_kills_a_procs_actor(
    mesh: LocalMesh[Counter], endpoint: str, why: str
) -> None:
    # As zmesh._host.proc.actordeath: not an Exception (a CancelledError the
    # endpoint raised itself, its task not being cancelled, included).
    one = mesh.slice(procs=1)
    with pytest.raises(zmesh.SupervisionError, match=why) as info:
        getattr(one, endpoint).call_one().get(timeout=5)
    assert info.value.rank == 1
    with pytest.raises(zmesh.SupervisionError, match=why):
        one.rank.call_one().get(timeout=5)
    assert mesh.slice(procs=0).rank.call_one().get(timeout=5) == 0


def test_calls_after_stop_raise_actor_stopped_error() -> None:
    m = local_mesh(Counter)
    in_flight = m.nap.call_one(30)  # running or still queued: either way it fails the same
    m.stop().get(timeout=5)
    with pytest.raises(zmesh.ActorStoppedError):
        in_flight.get(timeout=5)
    with pytest.raises(zmesh.ActorStoppedError):
        m.rank.call_one().get(timeout=5)


def test_init_failure_is_a_spawn_error() -> None:
    with pytest.raises(zmesh.SpawnError, match="no GPU"):
        local_mesh(Broken, procs=2)


async def test_a_mesh_handle_passed_to_an_actor_is_the_same_mesh(
    mesh: LocalMesh[Counter],
) -> None:
    with local_mesh(Summer, mesh) as summer:
        assert await summer.total.call_one() == 6
        assert await summer.total_sync.call_one() == 6


def test_current_rank_outside_an_actor_still_fails() -> None:
    with pytest.raises(RuntimeError, match="only available inside an actor"):
        zmesh.current_rank()

"""Every adverb (call, call_one, broadcast, choose, stream) on meshes of 1, 4 and 2x2 actors.

The meshes run on the embedded default agents (2x2: two local agents, one per
host). One mesh per shape is shared by the tests of this module; tests only
use stateless endpoints or tokens of their own, so they stay independent.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import zmesh

from _keptagents import stop_meshes
from integration._fabric import Notebook


class Worker(Notebook):
    def __init__(self) -> None:
        self.notes: list[str] = []

    @zmesh.endpoint
    def where(self) -> tuple[int, dict[str, int]]:
        p = zmesh.current_rank()
        return p.rank, p.coords

    @zmesh.endpoint
    async def awhere(self) -> tuple[int, dict[str, int]]:
        p = zmesh.current_rank()
        return p.rank, p.coords

    @zmesh.endpoint
    async def nap_if(self, rank: int, seconds: float) -> int:
        me = zmesh.current_rank().rank
        if me == rank:
            await asyncio.sleep(seconds)
        return me

    @zmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

    @zmesh.endpoint
    async def fail_if(self, rank: int) -> int:
        me = zmesh.current_rank().rank
        if me == rank:
            raise ValueError(f"rank {me} fails")
        return me

    @zmesh.endpoint
    def agent_pid(self) -> int:
        return os.getppid()  # procs are children of their host's agent


SHAPES: dict[str, dict[str, Any]] = {
    "1": {},
    "4": {"procs": 4},
    "2x2": {"hosts": 2, "procs": 2},
}


@pytest.fixture(autouse=True)
def _stop_everything() -> Iterator[None]:
    # Overrides the conftest fixture: the module's meshes outlive single tests
    # and are stopped by the module fixture below.
    yield


@pytest.fixture(scope="module", params=list(SHAPES))
def mesh(request: pytest.FixtureRequest) -> Iterator[zmesh.ActorMesh[Worker]]:
    m = Worker.options(**SHAPES[request.param]).as_actor().get(timeout=60)
    yield m
    stop_meshes()


def expected(mesh: zmesh.ActorMesh[Any]) -> list[tuple[int, dict[str, int]]]:
    """(rank, coords) of every actor, row-major, hosts first."""
    hosts, procs = mesh.sizes["hosts"], mesh.sizes["procs"]
    return [(h * procs + p, {"hosts": h, "procs": p}) for h in range(hosts) for p in range(procs)]


def singles(mesh: zmesh.ActorMesh[Any]) -> list[zmesh.ActorMesh[Any]]:
    """A one-actor view of every actor, in rank order."""
    return [
        mesh.slice(hosts=h, procs=p)
        for h in range(mesh.sizes["hosts"])
        for p in range(mesh.sizes["procs"])
    ]


def test_mesh_shape(mesh: zmesh.ActorMesh[Worker]) -> None:
    n = len(expected(mesh))
    assert len(mesh) == n
    assert mesh.sizes["hosts"] * mesh.sizes["procs"] == n
    # Every actor is its own OS process.
    pids = mesh.pid.call().get(timeout=10).values()
    assert len(set(pids)) == n
    assert os.getpid() not in pids
    # One agent per host (the embedded default starts one per host asked for).
    agents = mesh.agent_pid.call().get(timeout=10).values()
    procs = mesh.sizes["procs"]
    by_host = [set(agents[h * procs : (h + 1) * procs]) for h in range(mesh.sizes["hosts"])]
    assert all(len(s) == 1 for s in by_host)
    assert len(set(agents)) == mesh.sizes["hosts"]


# ---------------------------------------------------------------- call


@pytest.mark.anyio
async def test_call_async_values_in_rank_order(mesh: zmesh.ActorMesh[Worker]) -> None:
    for ep in (mesh.where, mesh.awhere):
        vm = await ep.call()
        assert isinstance(vm, zmesh.ValueMesh)
        assert vm.values() == expected(mesh)
        assert len(vm) == len(mesh)
        items = vm.items()
        assert [v for _, v in items] == vm.values()
        for point, (rank, coords) in items:
            assert isinstance(point, zmesh.Point)
            assert point.rank == rank
            assert point.coords == coords
            assert point["procs"] == coords["procs"]


def test_call_sync_get(mesh: zmesh.ActorMesh[Worker]) -> None:
    vm = mesh.awhere.call().get(timeout=10)
    assert vm.values() == expected(mesh)
    assert [p.rank for p, _ in vm.items()] == list(range(len(mesh)))


# ------------------------------------------------------------- call_one


@pytest.mark.anyio
async def test_call_one_each_actor(mesh: zmesh.ActorMesh[Worker]) -> None:
    if len(mesh) == 1:
        assert await mesh.where.call_one() == (0, {"hosts": 0, "procs": 0})
    for want, one in zip(expected(mesh), singles(mesh), strict=True):
        assert len(one) == 1
        assert await one.awhere.call_one() == want


def test_call_one_sync(mesh: zmesh.ActorMesh[Worker]) -> None:
    last = singles(mesh)[-1]
    assert last.where.call_one().get(timeout=10) == expected(mesh)[-1]


def test_call_one_on_many_raises_before_sending(mesh: zmesh.ActorMesh[Worker]) -> None:
    if len(mesh) == 1:
        pytest.skip("a one-actor mesh accepts call_one")
    token = uuid.uuid4().hex
    with pytest.raises(ValueError, match="exactly one actor"):
        mesh.note.call_one(token)  # raised at the call, not from a future
    with pytest.raises(ValueError):
        mesh.slice(procs=slice(0, 2)).note.call_one(token)
    # Nothing was sent: no actor saw the token (ordering makes this exact).
    seen = mesh.seen.call().get(timeout=10).values()
    assert all(token not in s for s in seen)


# ------------------------------------------------------------ broadcast


@pytest.mark.anyio
async def test_broadcast_async(mesh: zmesh.ActorMesh[Worker]) -> None:
    token = uuid.uuid4().hex
    assert mesh.note.broadcast(token) is None  # type: ignore[func-returns-value]
    # Same sender, same actors: the broadcast ran before this call.
    seen = (await mesh.seen.call()).values()
    assert all(s.count(token) == 1 for s in seen)


def test_broadcast_sync(mesh: zmesh.ActorMesh[Worker]) -> None:
    token = uuid.uuid4().hex
    assert mesh.note.broadcast(token) is None  # type: ignore[func-returns-value]
    seen = mesh.seen.call().get(timeout=10).values()
    assert all(s.count(token) == 1 for s in seen)


def test_broadcast_to_slice_only_reaches_slice(mesh: zmesh.ActorMesh[Worker]) -> None:
    token = uuid.uuid4().hex
    first = singles(mesh)[0]
    first.note.broadcast(token)
    seen = mesh.seen.call().get(timeout=10).values()
    assert [token in s for s in seen] == [True] + [False] * (len(mesh) - 1)


# --------------------------------------------------------------- choose


@pytest.mark.anyio
async def test_choose_returns_one_actors_value(mesh: zmesh.ActorMesh[Worker]) -> None:
    everyone = expected(mesh)
    got = [await mesh.where.choose() for _ in range(4 * len(mesh))]
    assert all(v in everyone for v in got)
    # Equally idle actors share the work: each one is chosen.
    assert {r for r, _ in got} == set(range(len(mesh)))


def test_choose_sync(mesh: zmesh.ActorMesh[Worker]) -> None:
    v = mesh.awhere.choose().get(timeout=10)
    assert v in expected(mesh)


@pytest.mark.anyio
async def test_choose_avoids_a_busy_actor(mesh: zmesh.ActorMesh[Worker]) -> None:
    if len(mesh) == 1:
        pytest.skip("needs a choice")
    busy = mesh.slice(hosts=0, procs=0).nap_if.call_one(0, 1.0)  # rank 0 busy for 1 s
    got = [await mesh.awhere.choose() for _ in range(2 * len(mesh))]
    assert 0 not in {r for r, _ in got}
    assert await busy == 0


# --------------------------------------------------------------- stream


@pytest.mark.anyio
async def test_stream_async_for(mesh: zmesh.ActorMesh[Worker]) -> None:
    got = [v async for v in mesh.awhere.stream()]
    assert sorted(got) == expected(mesh)


def test_stream_sync_for(mesh: zmesh.ActorMesh[Worker]) -> None:
    got = []
    for v in mesh.where.stream():
        got.append(v)
    assert sorted(got) == expected(mesh)


@pytest.mark.anyio
async def test_stream_keeps_its_place_in_send_order(mesh: zmesh.ActorMesh[Worker]) -> None:
    token = uuid.uuid4().hex
    seen = mesh.seen.stream()  # sent now, before the broadcast below
    mesh.note.broadcast(token)
    async for notes in seen:
        assert token not in notes
    assert all(token in notes for notes in (await mesh.seen.call()).values())


def test_stream_made_in_plain_code_keeps_its_place(mesh: zmesh.ActorMesh[Worker]) -> None:
    token = uuid.uuid4().hex
    seen = mesh.seen.stream()
    mesh.note.broadcast(token)
    assert all(token not in notes for notes in seen)


def test_stream_sync_for_in_a_thread(mesh: zmesh.ActorMesh[Worker]) -> None:
    # Plain code in any thread (no loop there) can iterate a stream.
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.extend(mesh.where.stream()))
    t.start()
    t.join(timeout=10)
    assert not t.is_alive()
    assert sorted(out) == expected(mesh)


@pytest.mark.anyio
async def test_stream_yields_replies_as_they_arrive(mesh: zmesh.ActorMesh[Worker]) -> None:
    if len(mesh) == 1:
        pytest.skip("needs several replies")
    start = time.monotonic()
    arrivals = []
    async for rank in mesh.nap_if.stream(0, 2.0):  # rank 0 answers 2 s late
        arrivals.append((rank, time.monotonic() - start))
    assert sorted(r for r, _ in arrivals) == list(range(len(mesh)))
    assert arrivals[-1][0] == 0
    # The quick ones were yielded long before the slow one answered.
    assert all(t < 1.5 for r, t in arrivals[:-1]), arrivals
    assert arrivals[-1][1] >= 1.9


def _in_thread(fn: Any, timeout: float = 10.0) -> Any:
    """Run ``fn`` in a thread: a hang fails the test instead of blocking the suite."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn} did not return within {timeout}s"
    return out[0]


def test_stream_iterated_again_replays_its_replies(mesh: zmesh.ActorMesh[Worker]) -> None:
    s = mesh.where.stream()
    first = _in_thread(lambda: list(s))
    assert sorted(first) == expected(mesh)
    assert _in_thread(lambda: sorted(s)) == sorted(first)  # what `sorted(s)` then `list(s)` does
    assert _in_thread(lambda: list(s)) == first  # in arrival order, every time


def test_stream_partly_iterated_then_again_gives_everything(
    mesh: zmesh.ActorMesh[Worker],
) -> None:
    s = mesh.where.stream()
    head = _in_thread(lambda: next(iter(s)))
    whole = _in_thread(lambda: list(s))
    assert whole[0] == head and sorted(whole) == expected(mesh)


@pytest.mark.anyio
async def test_stream_iterated_again_async(mesh: zmesh.ActorMesh[Worker]) -> None:
    s = mesh.awhere.stream()
    first = [v async for v in s]
    again = await asyncio.wait_for(_collect(s), 5.0)
    assert again == first and sorted(first) == expected(mesh)
    async for v in s:  # a partial pass, then a full one
        assert v == first[0]
        break
    assert await asyncio.wait_for(_collect(s), 5.0) == first


async def _collect(s: Any) -> list[Any]:
    return [v async for v in s]


@pytest.mark.anyio
async def test_stream_failure_is_raised_again_on_replay(mesh: zmesh.ActorMesh[Worker]) -> None:
    s = mesh.fail_if.stream(len(mesh) - 1)
    for _ in range(2):
        got: list[int] = []
        with pytest.raises(zmesh.ActorError, match="fails"):
            async for v in s:
                got.append(v)
        assert len(got) <= len(mesh) - 1

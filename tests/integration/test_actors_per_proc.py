"""Several actors per proc (``actors_per_proc``): dims, ranks, order, errors, supervision.

Real procs: one module mesh of 2 procs x 16 actors for the calls, and meshes
of their own for what kills or fails.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

import zmesh

from _helpers import (
    keep_module_meshes,  # noqa: F401  (a fixture: the mesh outlives tests)
    wait_until,
)
from _keptagents import stop_meshes

PROCS, PER = 2, 16


class Sim(zmesh.Actor):
    """Knows where it is; keeps what it was sent, in arrival order."""

    def __init__(self, fail_rank: int = -1) -> None:
        me = zmesh.current_rank()
        if me.rank == fail_rank:
            raise RuntimeError(f"actor {me.rank} refuses to start")
        self.log: list[int] = []
        self.notes: list[tuple[Any, ...]] = []

    @zmesh.endpoint
    async def where(self) -> dict[str, Any]:
        me = zmesh.current_rank()
        ctx = zmesh.context()
        return {
            "point": dict(me), "rank": me.rank, "pid": os.getpid(),
            "name": zmesh.current_actor_name(), "id": ctx.actor_instance.actor_id,
        }  # fmt: skip

    @zmesh.endpoint
    async def append(self, i: int) -> int:
        await asyncio.sleep(0)  # a chance to be overtaken, were it allowed
        self.log.append(i)
        return zmesh.current_rank().rank

    @zmesh.endpoint
    def append_sync(self, i: int) -> int:
        time.sleep(0.0005)  # blocks a worker thread: the others' actors go on
        self.log.append(i)
        return zmesh.current_rank().rank

    @zmesh.endpoint
    async def take(self) -> list[int]:
        log, self.log = self.log, []
        return log

    @zmesh.endpoint
    async def fail_at(self, rank: int) -> int:
        me = zmesh.current_rank().rank
        if me == rank:
            raise ValueError(f"actor {me} raises")
        return me

    @zmesh.endpoint
    async def blob(self, n: int) -> bytes:
        return bytes([zmesh.current_rank().rank % 256]) * n

    @zmesh.endpoint
    async def count(self, n: int) -> Any:
        for i in range(n):
            yield (zmesh.current_rank().rank, i)

    @zmesh.endpoint(batch=8, batch_wait=0.002)
    async def batched(self, items: list[int]) -> list[int]:
        me = zmesh.current_rank().rank
        return [me * 1000 + x for x in items]

    @zmesh.endpoint(concurrent=True)
    async def ping(self) -> int:
        return zmesh.current_rank().rank

    @zmesh.endpoint
    async def sleep(self, s: float) -> int:
        await asyncio.sleep(s)
        return 0

    @zmesh.endpoint
    async def note(self, sender: int, i: int) -> float:
        """A plain async endpoint (a fan-out's fast path); one in three suspends."""
        if i % 3 == 0:
            await asyncio.sleep(0)
        self.notes.append((sender, i))
        return time.monotonic()

    @zmesh.endpoint
    def note_sync(self, sender: int, i: int) -> float:
        """A short sync endpoint (a fan-out runs its parts in one thread)."""
        self.notes.append((sender, i))
        return time.monotonic()

    @zmesh.endpoint
    def hold(self, s: float) -> float:
        """A slow sync endpoint: the actor is busy for ``s`` seconds."""
        time.sleep(s)
        self.notes.append(("held",))
        return time.monotonic()

    @zmesh.endpoint
    async def take_notes(self) -> list[tuple[Any, ...]]:
        notes, self.notes = self.notes, []
        return notes


@pytest.fixture(scope="module")
def sims() -> Iterator[zmesh.ActorMesh[Sim]]:
    mesh = Sim.options(procs=PROCS, actors_per_proc=PER).as_actor().get(timeout=60)
    yield mesh
    stop_meshes()


@pytest.mark.anyio
async def test_dims_ranks_and_context_inside_each_actor(sims: zmesh.ActorMesh[Sim]) -> None:
    assert sims.sizes == {"hosts": 1, "procs": PROCS, "actors": PER}
    assert len(sims) == PROCS * PER
    vm = await sims.where.call()
    seen = dict(vm.items())
    assert len(seen) == PROCS * PER
    pids_by_proc: dict[int, set[int]] = {}
    ids = set()
    for point, v in seen.items():
        # Row-major, the actors of a proc together: rank = procs * PER + actors.
        assert point.rank == point["procs"] * PER + point["actors"] == v["rank"]
        assert v["point"] == {"hosts": 0, "procs": point["procs"], "actors": point["actors"]}
        assert v["name"] == sims.actor
        pids_by_proc.setdefault(point["procs"], set()).add(v["pid"])
        ids.add(v["id"])
    assert len(ids) == PROCS * PER  # each actor is its own
    # Each proc is one process for its PER actors.
    assert all(len(p) == 1 for p in pids_by_proc.values())
    assert len(set().union(*pids_by_proc.values())) == PROCS
    # ValueMesh over the new dims; slices and flatten keep the points.
    assert vm.item(hosts=0, procs=1, actors=3)["rank"] == PER + 3
    col = await sims.slice(actors=3).where.call()
    assert col.sizes == {"hosts": 1, "procs": PROCS}
    assert [v["rank"] for v in col.values()] == [p * PER + 3 for p in range(PROCS)]
    one = await sims.slice(procs=1, actors=slice(2, 5)).where.call()
    assert [v["rank"] for v in one.values()] == [PER + 2, PER + 3, PER + 4]
    flat = sims.flatten("all")
    assert flat.sizes == {"all": PROCS * PER}
    assert (await flat.slice(all=PER + 7).where.call_one())["rank"] == PER + 7
    assert (await sims.where.choose())["rank"] in range(PROCS * PER)


@pytest.mark.anyio
async def test_pipelined_burst_each_actor_sees_its_own_calls_in_order(
    sims: zmesh.ActorMesh[Sim],
) -> None:
    n = 200
    await sims.take.call()  # empty logs
    # Per actor: call_one to it, interleaved with fan-outs and broadcasts
    # to all, all sent before any answer is awaited.
    actors = [sims.flatten("a").slice(a=r) for r in range(PROCS * PER)]
    futs: list[Any] = []
    for i in range(n):
        ep = "append" if i % 2 else "append_sync"
        if i % 10 == 0:
            futs.append(getattr(sims, ep).call(i))
        elif i % 10 == 5:
            sims.append.broadcast(i)
        else:
            futs.extend(getattr(a, ep).call_one(i) for a in actors)
    await asyncio.gather(*(_aw(f) for f in futs))
    logs = await sims.take.call()
    expected = list(range(n))
    for point, log in logs.items():
        assert log == expected, f"actor {point.rank} saw its calls out of order or lost some"


async def _aw(fut: Any) -> Any:
    return await fut


@pytest.mark.anyio
async def test_fan_outs_and_call_ones_interleaved_keep_each_senders_order(
    sims: zmesh.ActorMesh[Sim],
) -> None:
    # Per sender, over and over: a fan-out to all, a call_one to one actor, a
    # fan-out again, all in flight at once, to an async and a sync endpoint. A
    # fan-out's part for an idle actor runs at once, one for a busy actor waits
    # in its mailbox: either way each actor runs its messages in each sender's
    # order.
    n = 60
    total = PROCS * PER
    await sims.take_notes.call()
    flat = sims.flatten("a")
    actors = [flat.slice(a=r) for r in range(total)]
    sent: dict[int, dict[int, list[int]]] = {s: {r: [] for r in range(total)} for s in (0, 1)}

    async def sender(s: int) -> None:
        futs: list[Any] = []
        for i in range(n):
            a, b, c = 3 * i, 3 * i + 1, 3 * i + 2
            k = (7 * i + s) % total
            ep = "note" if i % 2 else "note_sync"
            futs.append(getattr(sims, ep).call(s, a))
            futs.append(actors[k].note.call_one(s, b))
            futs.append(getattr(sims, ep).call(s, c))
            for r in range(total):
                sent[s][r].append(a)
                if r == k:
                    sent[s][r].append(b)
                sent[s][r].append(c)
            if i % 8 == 0:
                await asyncio.sleep(0)  # the two senders' messages interleave
        await asyncio.gather(*(_aw(f) for f in futs))

    await asyncio.gather(sender(0), sender(1))
    notes = await sims.take_notes.call()
    for point, got in notes.items():
        for s in (0, 1):
            seen = [i for who, i in got if who == s]
            assert seen == sent[s][point.rank], f"actor {point.rank}: sender {s}'s order broke"


@pytest.mark.anyio
@pytest.mark.parametrize("ep", ["note", "note_sync"])
async def test_a_fan_out_waits_for_a_busy_actor_and_not_for_the_idle_ones(
    sims: zmesh.ActorMesh[Sim], ep: str
) -> None:
    await getattr(sims, ep).call(9, 0)  # (a sync endpoint's calls are timed first)
    await sims.take_notes.call()
    flat = sims.flatten("a")
    busy = PER + 2
    held = flat.slice(a=busy).hold.call_one(0.5)  # busy for 0.5 s, in a worker thread
    await asyncio.sleep(0.05)  # (it has started)
    fan = getattr(sims, ep).call(9, 1)
    after = flat.slice(a=busy).note.call_one(9, 2)  # behind the fan-out's part
    done = await fan
    t_held = await held
    assert await after >= done.item(hosts=0, procs=1, actors=2) >= t_held
    for point, t in done.items():
        if point.rank != busy:
            assert t < t_held, f"idle actor {point.rank} waited for the busy one"
    notes = await sims.take_notes.call()
    assert notes.item(hosts=0, procs=1, actors=2) == [("held",), (9, 1), (9, 2)]
    assert all(v == [(9, 1)] for p, v in notes.items() if p.rank != busy)


def test_sync_code_and_streams_batching_and_buffers(sims: zmesh.ActorMesh[Sim]) -> None:
    # From plain code (.get(); one actor: on the thread's lane), per actor and fanned out.
    assert sims.slice(procs=0, actors=4).where.call_one().get(timeout=30)["rank"] == 4
    assert sorted(sims.fail_at.stream(-1)) == list(range(PROCS * PER))
    # A generator endpoint streams per actor.
    items = list(sims.slice(actors=slice(0, 2)).count.call(3))
    assert sorted(v for _, v in items) == sorted(
        (p * PER + a, i) for p in range(PROCS) for a in range(2) for i in range(3)
    )
    # A batched endpoint batches per actor.
    one = sims.slice(procs=1, actors=5)
    got = [f.get(timeout=30) for f in [one.batched.call_one(x) for x in range(20)]]
    assert got == [(PER + 5) * 1000 + x for x in range(20)]
    # Values with buffer frames (large bytes) come back per actor.
    big = sims.slice(actors=slice(0, 3)).blob.call(100_000).get(timeout=30)
    for point, b in big.items():
        assert b == bytes([point.rank % 256]) * 100_000


@pytest.mark.anyio
async def test_one_actor_raising_leaves_the_others_results(sims: zmesh.ActorMesh[Sim]) -> None:
    bad = PER + 3
    stream: Any = sims.fail_at.stream(bad)  # its queue is read below, past the failure
    with pytest.raises(zmesh.ActorError) as info:
        async for _ in stream:
            pass
    assert info.value.rank == bad and "actor 19 raises" in str(info.value)
    # Every answer arrives, each its own: the neighbours' (same proc) values too
    # (read past the failure, from the stream's queue of answers).
    assert stream._aq is not None
    answers = list(stream._seen)
    while len(answers) < PROCS * PER:
        _, ok, v = await asyncio.wait_for(stream._aq.get(), 30)
        answers.append((ok, v))
    values = sorted(v for ok, v in answers if ok)
    assert values == [r for r in range(PROCS * PER) if r != bad]
    # call() fails with that actor's error, named by its rank.
    with pytest.raises(zmesh.ActorError) as info:
        await sims.fail_at.call(bad)
    assert info.value.rank == bad
    # And the actor is still alive.
    assert await sims.flatten("a").slice(a=bad).fail_at.call_one(-1) == bad


@pytest.mark.anyio
async def test_kill9_of_a_proc_fails_all_its_actors_calls_fast() -> None:
    mesh = await Sim.options(procs=2, actors_per_proc=8).as_actor()
    try:
        await mesh.where.call()
        pids = {v["pid"] for v in (await mesh.where.call()).values()}
        victim = (await mesh.slice(procs=1, actors=0).where.call_one())["pid"]
        assert victim in pids
        # In flight to each actor of the proc to kill, and a fan-out to all.
        slow = [mesh.flatten("a").slice(a=r).sleep.call_one(30) for r in range(8, 16)]
        fan = mesh.sleep.call(30)
        await asyncio.sleep(0.3)  # in flight
        t0 = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        results = await asyncio.gather(*(_aw(f) for f in slow), return_exceptions=True)
        with pytest.raises(zmesh.SupervisionError) as info:
            await fan
        took = time.monotonic() - t0
        assert took < 10, f"in-flight calls took {took:.1f}s to fail"
        assert info.value.rank is not None and 8 <= info.value.rank < 16
        for r, res in enumerate(results, start=8):
            assert isinstance(res, zmesh.SupervisionError), res
            assert res.rank == r and res.mesh == mesh.proc_mesh and res.log_path
        # The other proc's actors are alive (busy with the fan-out's sleep: a
        # concurrent endpoint answers); later calls to the dead ones fail at once.
        assert len(await mesh.slice(procs=0).ping.call()) == 8
        with pytest.raises(zmesh.SupervisionError):
            await mesh.slice(procs=1, actors=5).where.call_one()
    finally:
        await mesh.stop()


@pytest.mark.anyio
async def test_failing_init_of_one_actor_is_a_spawn_error_naming_its_rank() -> None:
    bad = 8 + 5
    mesh = Sim.options(procs=2, actors_per_proc=8).as_actor(bad)
    with pytest.raises(zmesh.SpawnError) as info:
        await mesh
    assert info.value.rank == bad
    assert "actor 13 refuses to start" in str(info.value)
    with pytest.raises(zmesh.SpawnError):
        await mesh.where.call()


class Cleaned(zmesh.Actor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.me = zmesh.current_rank().rank

    @zmesh.endpoint
    async def rank(self) -> int:
        return zmesh.current_rank().rank

    def __cleanup__(self, exc: BaseException | None) -> None:
        with open(self.path, "a") as f:
            f.write(f"{self.me}\n")


@pytest.mark.anyio
async def test_proc_mesh_spawn_and_stop_runs_each_cleanup(tmp_path: Any) -> None:
    procs = zmesh.this_host().spawn_procs(per_host={"procs": 2})
    path = str(tmp_path / "cleanup")
    try:
        mesh = procs.spawn("cl", Cleaned, path, actors_per_proc=3)
        assert mesh.sizes == {"hosts": 1, "procs": 2, "actors": 3}
        assert sorted((await mesh.rank.call()).values()) == list(range(6))
        await mesh.stop()
        await wait_until(lambda: len(_lines(path)) == 6, 10, "every actor's __cleanup__")
        assert sorted(int(x) for x in _lines(path)) == list(range(6))
        with pytest.raises(zmesh.ActorStoppedError):
            await mesh.rank.call()
    finally:
        await procs.stop()


class Relay(zmesh.Actor):
    """Calls a mesh handle it was given, from its own proc."""

    @zmesh.endpoint
    async def ranks(self, mesh: zmesh.ActorMesh[Sim]) -> tuple[list[int], int]:
        fan = await mesh.where.call()
        one = await mesh.slice(procs=1, actors=PER - 1).where.call_one()
        return [v["rank"] for v in fan.values()], one["rank"]


@pytest.mark.anyio
async def test_calls_before_the_spawn_is_done_and_a_handle_passed_to_an_actor(
    sims: zmesh.ActorMesh[Sim],
) -> None:
    mesh = Sim.options(procs=1, actors_per_proc=4).as_actor()
    early = mesh.where.call()  # queued until the actors are up
    one = mesh.slice(actors=2).where.call_one()
    assert sorted(v["rank"] for v in (await early).values()) == [0, 1, 2, 3]
    assert (await one)["rank"] == 2
    await mesh.stop()
    relay = await Relay.options().as_actor()
    try:
        fan, one_rank = await relay.ranks.call_one(sims)
        assert fan == list(range(PROCS * PER))
        assert one_rank == 2 * PER - 1
    finally:
        await relay.stop()


def _lines(path: str) -> list[str]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return f.read().split()


def test_bad_actors_per_proc_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="actors_per_proc"):
        Sim.options(actors_per_proc=0)
    with pytest.raises(TypeError, match="actors_per_proc"):
        Sim.options(actors_per_proc="2")
    with pytest.raises(ValueError, match="actors_per_proc"):
        Sim.options(replicas=2, actors_per_proc=2)


@pytest.mark.anyio
async def test_a_slow_sync_endpoint_fanned_out_still_overlaps_across_actors(
    sims: zmesh.ActorMesh[Sim],
) -> None:
    # Short sync parts share one worker thread; a part that takes long sends
    # the rest to a thread each, so 16 sleeps of 0.2 s overlap (in turn: 3.2 s).
    one = sims.slice(procs=0)
    t0 = time.monotonic()
    done = await one.hold.call(0.2)
    took = time.monotonic() - t0
    assert len(done) == PER
    assert took < 2.0, f"a fan-out of 0.2 s sync calls to {PER} actors took {took:.1f}s"
    await sims.take_notes.call()

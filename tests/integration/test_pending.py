"""Meshes are returned at once, spawn in the background, and queue the calls made meanwhile."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import pytest

import zmesh


class Log(zmesh.Actor):
    def __init__(self, delay: float = 0.0) -> None:
        time.sleep(delay)  # a slow __init__: calls made meanwhile must wait for it
        self.log: list[Any] = []

    @zmesh.endpoint
    async def add(self, item: Any) -> int:
        self.log.append(item)
        return len(self.log)

    @zmesh.endpoint
    def add_sync(self, item: Any) -> int:
        self.log.append(item)
        return len(self.log)

    @zmesh.endpoint
    async def take(self) -> list[Any]:
        return list(self.log)

    @zmesh.endpoint
    async def ask(self, other: zmesh.ActorMesh[Log]) -> list[Any]:
        one = other.slice(**zmesh.current_rank())
        return await one.take.call_one()


class Broken(zmesh.Actor):
    def __init__(self) -> None:
        raise RuntimeError("no GPU on this host")

    @zmesh.endpoint
    def ping(self) -> int:
        return os.getpid()


def test_spawn_returns_meshes_at_once_and_calls_queue_in_order() -> None:
    t0 = time.monotonic()
    procs = zmesh.this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("log", Log, 0.5)
    assert isinstance(procs, zmesh.ProcMesh) and isinstance(mesh, zmesh.ActorMesh)
    assert time.monotonic() - t0 < 0.5  # nothing waited for the procs
    assert not mesh.initialized.done()
    assert mesh.sizes == {"hosts": 1, "gpus": 2} and len(mesh) == 2
    # Every adverb, a slice and a sync endpoint, all before the actors exist.
    mesh.add.broadcast(0)
    first = mesh.slice(gpus=0)
    futs = [first.add.call_one(1), mesh.add_sync.call(2), mesh.add.choose(3)]
    mesh.slice(gpus=1).add.broadcast(4)
    stream = mesh.add.stream(5)
    assert mesh.initialized.get(timeout=60) is None
    assert futs[0].get(timeout=10) == 2
    assert futs[1].get(timeout=10).values() == [3, 2]
    assert futs[2].get(timeout=10) in (3, 4)
    assert sorted(stream) == [4, 5]
    logs = mesh.take.call().get(timeout=10).values()
    chosen = 0 if len(logs[0]) == 5 else 1
    expect0 = [0, 1, 2] + ([3] if chosen == 0 else []) + [5]
    expect1 = [0, 2] + ([3] if chosen == 1 else []) + [4, 5]
    assert logs == [expect0, expect1]
    assert mesh.take.call().get(timeout=10).values() == logs  # gate closed: fast path
    assert mesh._gate is None
    mesh.stop().get(timeout=10)
    procs.stop().get(timeout=10)


def test_many_queued_calls_from_threads_keep_each_threads_order() -> None:
    mesh = Log.options().as_actor(0.3)
    out: dict[int, list[zmesh.Future[int]]] = {}

    def sender(k: int) -> None:
        out[k] = [mesh.add.call_one((k, i)) for i in range(200)]

    threads = [threading.Thread(target=sender, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for futs in out.values():
        for f in futs:
            f.get(timeout=60)
    log = mesh.take.call_one().get(timeout=10)
    for k in range(3):
        assert [i for kk, i in log if kk == k] == list(range(200))
    mesh.stop().get(timeout=10)


@pytest.mark.anyio
async def test_async_queued_calls_keep_order_and_await_returns_the_mesh() -> None:
    mesh = Log.options(procs=2).as_actor(0.3)
    futs = [mesh.add.call(i) for i in range(50)]
    ones = [mesh.slice(procs=1).add.call_one(100 + i) for i in range(50)]
    assert (await mesh) is mesh
    await asyncio.gather(*futs, *ones)
    logs = (await mesh.take.call()).values()
    assert logs == [list(range(50)), list(range(50)) + [100 + i for i in range(50)]]
    with pytest.raises(RuntimeError, match="await"):
        Log.options().as_actor().initialized.get(timeout=1)  # on its own loop: await it
    await mesh.stop()


@pytest.mark.anyio
async def test_a_spawning_mesh_can_be_passed_in_a_call_or_a_spawn() -> None:
    procs = zmesh.this_host().spawn_procs(per_host={"procs": 2})
    a = procs.spawn("a", Log, 0.3)
    b = procs.spawn("b", Log)
    b.add.broadcast("from-client")
    # ``a`` gets ``b`` while both still spawn: the call waits for b's procs.
    seen = await a.ask.call(b)
    assert seen.values() == [["from-client"], ["from-client"]]
    c = procs.spawn("c", Log)
    asker = procs.spawn("asker", Log)
    assert (await asker.ask.call(c)).values() == [[], []]
    await procs.stop()


def test_a_failing_init_surfaces_at_await_initialized_and_calls() -> None:
    mesh = Broken.options(procs=2).as_actor()
    early = mesh.ping.call()  # queued before the failure is known
    mesh.ping.broadcast()  # nobody to tell: dropped, logged
    with pytest.raises(zmesh.SpawnError, match="no GPU") as info:
        mesh.initialized.get(timeout=60)
    assert "RuntimeError" in str(info.value)  # the remote traceback
    with pytest.raises(zmesh.SpawnError, match="no GPU"):
        early.get(timeout=10)
    with pytest.raises(zmesh.SpawnError, match="no GPU"):
        mesh.slice(procs=0).ping.call_one().get(timeout=10)  # a later call fails at once
    with pytest.raises(zmesh.SpawnError, match="no GPU"):
        list(mesh.ping.stream())
    with pytest.raises(zmesh.SpawnError):
        mesh.get(timeout=10)
    mesh.stop().get(timeout=10)  # nothing to stop: no error

    async def waits() -> None:
        with pytest.raises(zmesh.SpawnError, match="no GPU"):
            await Broken.options().as_actor()
        procs = zmesh.this_host().spawn_procs()
        m = procs.spawn("broken", Broken)
        with pytest.raises(zmesh.SpawnError, match="no GPU"):
            await m
        with pytest.raises(zmesh.SpawnError, match="no GPU"):
            await m.ping.call_one()
        assert (await procs) is procs  # the procs themselves are fine
        await procs.stop()

    asyncio.run(waits())


def test_stop_while_spawning_stops_once_up() -> None:
    mesh = Log.options(procs=2).as_actor(0.3)
    mesh.stop().get(timeout=60)
    with pytest.raises(zmesh.ActorStoppedError):
        mesh.take.call().get(timeout=10)


@pytest.mark.parametrize("where", ["loop", "plain"])
def test_a_queued_call_keeps_its_timeout_and_is_never_sent_once_it_passes(where: str) -> None:
    """A call on a mesh still spawning has its budget from the call: it fails
    with CallTimeoutError when the budget passes first, and never goes out."""
    procs = zmesh.this_host().spawn_procs(per_host={"gpus": 1})
    mesh = procs.spawn("slow", Log, 4.0)
    try:
        t0 = time.monotonic()
        quick = mesh.add.options(timeout=0.5)
        if where == "loop":

            async def main() -> None:
                with pytest.raises(zmesh.CallTimeoutError, match="never sent"):
                    await quick.call_one("late")

            asyncio.run(main())
        else:
            with pytest.raises(zmesh.CallTimeoutError, match="never sent"):
                quick.call_one("late").get()
        assert time.monotonic() - t0 < 3.5, "the timeout ran from the mesh's readiness"
        assert not mesh.initialized.done()
        # Later calls still go, in order; the timed-out one never reached the actor.
        assert mesh.add.call_one("next").get(timeout=60) == 1
        assert mesh.take.call_one().get(timeout=30) == ["next"]
    finally:
        procs.stop().get(timeout=30)

"""A long-lived client: meshes come and go, and nothing of them stays behind.

A mesh that is stopped, or whose every rank broke, is released: its
sockets close, and the controller forgets its view, hosts and dedup entries,
keeping only a bounded tombstone so a stale handle still fails fast.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

import zmesh
from zmesh._client.calls import runtime as _runtime
from zmesh._client.control import controller as _controller

from _helpers import wait_for
from integration._light import Echo

# Enough cycles to cross the tombstone bound (lowered to TOMBSTONES for the test)
# four times over and to read the fd count's slope at every fiftieth: a leak of
# one fd or one entry a cycle shows as +50 between two reads, far past the slack.
CYCLES = 200
TOMBSTONES = 50
READ_EVERY = 50


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def footprint(rt: _runtime.Runtime) -> dict[str, int]:
    """What the client keeps per mesh, which must not grow with the meshes it had."""
    ctl = rt.controller
    return {
        "conns": len(rt.conns),
        "views": len(ctl.views),
        "hosts": len(ctl.hosts),
        "dedup": len(ctl.dedup),
        "listeners": len(ctl.listeners),
        "changed": len(ctl.changed),
        "owned": len(ctl.owned),
    }


async def released(rt: _runtime.Runtime, timeout: float = 5.0) -> dict[str, int]:
    """The footprint once stopped meshes are released (when their ranks report Stopped)."""
    deadline = time.monotonic() + timeout
    while any(footprint(rt).values()) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return footprint(rt)


async def settle_fds(limit: int, timeout: float = 5.0) -> int:
    """The fd count once closed sockets are gone (libzmq closes them in the background)."""
    deadline = time.monotonic() + timeout
    while fds() > limit and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return fds()


@pytest.mark.stress
@pytest.mark.timeout(300)  # ~0.1 s a cycle on 2 busy cores
@pytest.mark.anyio
async def test_spawn_call_stop_200_meshes_leaks_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_controller, "TOMBSTONES", TOMBSTONES)
    rt, _ = _runtime.current()
    first = await Echo.options().as_actor()
    assert await first.echo.call_one(0) == 0
    await first.stop()
    await released(rt)
    base = await settle_fds(0, timeout=0.5)  # after one full cycle: agent and forkserver up
    t0 = time.monotonic()
    for i in range(1, CYCLES):
        mesh = await Echo.options().as_actor()
        assert await mesh.echo.call_one(i) == i
        await mesh.stop()
        if i % READ_EVERY == 0:
            assert not any((left := await released(rt)).values()), left
            assert await settle_fds(base + 8) <= base + 8, f"cycle {i}: fds {fds()} vs {base}"
            assert len(rt.controller.tombstones) <= TOMBSTONES
    per_cycle = (time.monotonic() - t0) / (CYCLES - 1)
    assert not any((left := await released(rt)).values()), left
    assert await settle_fds(base + 8) <= base + 8
    # Stale handles still fail fast, with no socket made for them: the last
    # (tombstone) and the first (forgotten here; its agent is asked).
    for stale in (mesh, first):
        t1 = time.monotonic()
        with pytest.raises((zmesh.ActorStoppedError, zmesh.SupervisionError)):
            await asyncio.wait_for(_aw(stale.echo.call_one(1)), 10)
        assert time.monotonic() - t1 < 5
    with pytest.raises(zmesh.ActorStoppedError):
        await mesh.echo.call_one(1)
    print(f"{CYCLES} spawn/call/stop cycles, {per_cycle * 1000:.0f} ms each")


async def _aw(fut: zmesh.Future[int]) -> int:
    return await fut


@pytest.mark.anyio
async def test_a_stopped_mesh_releases_its_socket_and_state() -> None:
    rt, _ = _runtime.current()
    mesh = await Echo.options(procs=2).as_actor()
    assert (await mesh.echo.call(1)).values() == [1, 1]
    assert len(rt.conns) == 2 and mesh.proc_mesh in rt.controller.views
    await mesh.stop()
    assert not any((left := await released(rt)).values()), left
    assert mesh.state().status == zmesh.Status.STOPPED
    with pytest.raises(zmesh.ActorStoppedError) as info:
        await mesh.echo.call(1)
    assert info.value.mesh == mesh.proc_mesh
    assert footprint(rt)["conns"] == 0  # the stale call made no socket


@pytest.mark.anyio
async def test_a_mesh_whose_ranks_all_died_is_released_and_fails_fast() -> None:
    rt, _ = _runtime.current()
    mesh = await Echo.options().as_actor()
    pid = await mesh.pid.call_one()
    os.kill(pid, signal.SIGKILL)
    while mesh.proc_mesh in rt.controller.views:
        await asyncio.sleep(0.02)
    assert footprint(rt)["conns"] == 0
    assert mesh.state().status == zmesh.Status.FAILED
    with pytest.raises(zmesh.SupervisionError, match="SIGKILL") as info:
        await mesh.echo.call_one(1)
    assert info.value.rank == 0 and info.value.log_path
    await mesh.stop()  # stopping a released mesh is harmless
    assert footprint(rt)["conns"] == 0


@pytest.mark.stress
def test_a_service_that_keeps_respawning_replicas_leaks_nothing() -> None:
    rt, _ = _runtime.current()
    svc = (
        Echo.options(replicas=2, backoff_initial=0.05, max_restarts=100)
        .as_service()
        .get(timeout=60)
    )
    try:
        assert svc.echo.call_one(1).get(timeout=10) == 1
        base_fds = fds()
        for k in range(30):
            rep = svc.replica(k % 2)
            assert rep is not None
            pid = rep.pid.call_one().get(timeout=10)
            gen = svc.statistics().replicas[k % 2].generation
            os.kill(pid, signal.SIGKILL)
            wait_for(partial(respawned, svc, k % 2, gen), 30, f"replica {k % 2} respawned")
            assert svc.echo.call_one(k).get(timeout=10) == k
        wait_for(lambda: fds() <= base_fds + 8, 10, "sockets of dead replicas closed")
        counts = _on_loop(rt, lambda: footprint(rt))
        # Two live replicas of one proc each; nothing of the 30 dead ones.
        assert counts["conns"] <= 2 and counts["views"] <= 2, counts
        assert counts["hosts"] <= 2 and counts["dedup"] <= 2 and counts["listeners"] <= 2, counts
    finally:
        svc.stop().get(timeout=30)


def respawned(svc: Any, index: int, generation: int) -> bool:
    """Whether replica ``index`` is past ``generation`` and the service is whole again."""
    return svc.statistics().replicas[index].generation > generation and (
        svc.statistics().state == "OK"
    )


def _on_loop(rt: _runtime.Runtime, fn: Callable[[], dict[str, int]]) -> dict[str, int]:
    """Run ``fn`` on the runtime's own loop (the io thread's, for plain code)."""

    async def run() -> dict[str, int]:
        return fn()

    return asyncio.run_coroutine_threadsafe(run(), rt.loop).result(10)


@pytest.mark.anyio
async def test_a_handle_whose_address_now_serves_another_mesh_fails_fast() -> None:
    # A proc's port reused by a later proc: a stale handle of the first must
    # not reach the second, and must not disturb the second's connection.
    rt, _ = _runtime.current()
    live = await Echo.options().as_actor()
    assert await live.echo.call_one(1) == 1
    ref = live._refs[0]
    stale_ref = _runtime.ProcRef(
        "gone-0000", 0, 1, ref.addr, ref.agent, ref.host, "/nonexistent.log"
    )
    raw: Any = live  # the handle's own fields, which a checker does not see on an Echo
    stale: zmesh.ActorMesh[Echo]
    stale = zmesh.ActorMesh("echo", "Echo", raw.endpoints, raw._shape, [stale_ref])
    with pytest.raises(zmesh.SupervisionError, match=f"now serves mesh {live.proc_mesh}"):
        await asyncio.wait_for(_aw(stale.echo.call_one(2)), 5)
    assert await live.echo.call_one(3) == 3
    assert rt.conns[ref.addr].mesh == live.proc_mesh

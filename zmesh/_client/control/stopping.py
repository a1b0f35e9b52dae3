"""Stopping: procs through their agents, and actors in their procs.

The other half of ``zmesh._client.control.spawning``: what ``ProcMesh.stop``,
``ActorMesh.stop``, a failed spawn and a service's supervisor use.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zmesh._client.calls.runtime import ProcRef, Runtime
from zmesh._client.control import local as _local
from zmesh._errors import AgentError, SecurityError
from zmesh._shared.state import Status
from zmesh._wire import messages as w

if TYPE_CHECKING:
    from zmesh._client.handles.mesh import ActorMesh, ProcMesh


def stop_request(name: str) -> Callable[[int], w.Stop]:
    """A ``Stop`` of mesh ``name``, with the proof that we own it."""
    return functools.partial(w.Stop, name=name, secret=_local.owner_secret())


async def stop_procs(rt: Runtime, refs: list[ProcRef]) -> None:
    """Stop the procs ``refs``: each one's agent is asked once per mesh."""
    by_agent: dict[str, list[ProcRef]] = {}
    for r in refs:
        by_agent.setdefault(r.agent, []).append(r)
    ctl = rt.controller
    for addr, rs in by_agent.items():
        agent = ctl.agent(addr)
        for r in rs:
            ctl.watch(r)
            # Calls made after stop() fail with ActorStoppedError at once,
            # without waiting for the agent's events.
            ctl.judge(agent, r.mesh, r.rank, Status.STOPPING, "")
        names = {r.mesh for r in rs}
        for n in names:
            try:
                await agent.request(stop_request(n), timeout=5.0)
            except AgentError:
                # The agent is gone (so are its procs) or cut off: it will
                # not say more, so nothing of the mesh needs to stay.
                ctl.release(n)
    # Once every rank is Stopped (the agents' events say so), the controller
    # releases the mesh: its sockets and state go, a tombstone stays.
    for n in {r.mesh for r in refs}:
        ctl.release_if_over(n)


async def stop_mesh_on(rt: Runtime, name: str, conns: list[Any]) -> None:
    """Ask each agent of ``conns`` to stop mesh ``name`` (one that is gone is skipped)."""
    for agent, _ in conns:
        try:
            await agent.request(stop_request(name), timeout=5.0)
        except AgentError:
            pass


async def stop_actors(rt: Runtime, mesh: ActorMesh[Any]) -> None:
    """Stop the actors of ``mesh`` in their procs (the procs stay).

    Raises:
        SecurityError: the procs' mesh is not ours (a handle another client
            made): its procs refused, and nothing was stopped.
    """
    fut: asyncio.Future[None] = rt.loop.create_future()
    remaining = len(mesh._refs)
    refused: list[SecurityError] = []

    def deliver(i: int, ok: bool, value: Any) -> None:
        nonlocal remaining
        remaining -= 1
        if not ok and isinstance(value, SecurityError):
            refused.append(value)
        if remaining == 0 and not fut.done():
            fut.set_result(None)

    # Its procs stop an actor only for their mesh's owner (the key proves it).
    proof = _local.mesh_proof(mesh._refs[0].mesh) if mesh._refs else ""
    rt.send(mesh._refs, lambda i: w.StopActor(i, mesh.actor, proof), [], deliver, timeout=5.0)
    await fut
    if refused:
        first = min(refused, key=lambda e: e.rank if e.rank is not None else 0)
        raise SecurityError(
            f"cannot stop {mesh.actor}: {first.message}", mesh=first.mesh, rank=first.rank,
            host=first.host, log_path=first.log_path,
        ) from first  # fmt: skip


async def stop_when_ready(rt: Runtime, mesh: ProcMesh | ActorMesh[Any], procs: bool) -> None:
    """``mesh.stop()``: a spawn of procs is given up, one of actors awaited; then stop.

    Nothing is left of a failed spawn, so there is nothing more to stop.
    """
    spawn = mesh._spawning
    if procs and spawn is not None and not mesh._ready.done():
        mesh._given_up = True
        task = spawn._afut
        if task is not None and task.get_loop() is rt.loop:
            task.cancel()  # _start_procs stops what it asked the agents for
        elif spawn._cfut is not None:
            spawn._cfut.cancel()
    try:
        await asyncio.wrap_future(mesh._ready)
    except Exception:
        return
    if procs and any(not r.agent for r in mesh._refs):
        return  # this_proc() of a client: the process is not ours to stop
    if procs:
        await stop_procs(rt, mesh._refs)
    else:
        await stop_actors(rt, mesh)  # type: ignore[arg-type]  # procs=False: an ActorMesh

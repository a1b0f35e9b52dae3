"""Spawning: meshes in the background, actors in procs, and stopping them.

Procs are started through their agents by ``zmesh._client.control.procstart``.

What ``HostMesh.spawn_procs``, ``ProcMesh.spawn`` and ``Cls.options().as_actor``
start in the background. Each returns its mesh at once, not ready yet (see
``zmesh._client.calls.pending``): the work here runs on the caller's runtime, fills
in the mesh's proc refs when the procs and actors are up, and settles the
mesh's ``initialized`` future, which releases the calls made meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import os
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from zmesh._actor import ActorBase, EndpointInfo, endpoints_of
from zmesh._client.calls import grouping as _grouping
from zmesh._client.calls import runtime as _runtime
from zmesh._client.calls.launch import submit
from zmesh._client.calls.pending import Gate, NotReady, Ready
from zmesh._client.calls.runtime import Runtime
from zmesh._client.control import actorwatch as _actorwatch
from zmesh._client.control import local as _local
from zmesh._client.control import lookup as _lookup
from zmesh._client.control import named as _named
from zmesh._client.control import procstart as _procstart
from zmesh._client.control import spawnprogress as _progress
from zmesh._client.control.actorstart import ActorStart
from zmesh._client.control.procsetup import ProcSetup
from zmesh._client.control.stopping import stop_procs
from zmesh._client.handles.mesh import ActorMesh, ProcMesh, check_mesh_name
from zmesh._errors import ActorStoppedError, SpawnError, ZmeshError
from zmesh._shared.points import Shape, check_per_proc
from zmesh._wire.codec import Codec

if TYPE_CHECKING:
    from zmesh._options import Options

A = TypeVar("A", bound=ActorBase)

# How long actors' __init__ may take to return (procs: procstart.SPAWN_TIMEOUT).
INIT_TIMEOUT = float(os.environ.get("ZMESH_INIT_TIMEOUT", "120"))


def start_procs(
    agents: list[str] | None,
    hosts: int,
    per_host: dict[str, int],
    base: str,
    exact: bool = False,
    setup: ProcSetup | None = None,
) -> ProcMesh:
    """``HostMesh.spawn_procs``: the ``ProcMesh`` now, its procs in the background.

    With ``exact``, ``base`` is the mesh's name on the agents, and a mesh of
    that name this client runs is updated to ``per_host`` (``zmesh._client.control.named``).
    """

    name = base if exact else f"{base}-{secrets.token_hex(4)}"
    dims = {"hosts": hosts, **per_host}
    pm = ProcMesh(name, Shape(dims, list(range(math.prod(dims.values())))), [])

    async def work(rt: Runtime) -> None:
        addrs = agents
        if addrs is None:
            addrs = await rt.loop.run_in_executor(None, _local.agents, hosts)
        if exact:
            up = await _named.spawn_or_update(rt, addrs, per_host, name, pm, setup)
        else:
            up = await _procstart.spawn_procs(rt, addrs, per_host, base, name, setup)
        pm._refs = up._refs

    _launch(pm, work)
    return pm


def start_actors(
    procs: ProcMesh,
    name: str,
    cls: type[A],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    per_proc: int = 1,
) -> ActorMesh[A]:
    """``ProcMesh.spawn``: the ``ActorMesh`` now, its actors once the procs are up.

    With ``per_proc`` > 1, that many actors in each proc, on one more dim, ``actors``.
    """
    per_proc = check_per_proc(per_proc)
    shape = _grouping.actors_shape(procs._shape, per_proc)
    mesh = _pending_actor_mesh(procs.proc_mesh, shape, name, cls)
    on_death = _actorwatch.handler()  # (the spawning actor is known here, not in work)

    async def work(rt: Runtime) -> None:
        if procs._stopped:
            raise ActorStoppedError("`ProcMesh` has already been stopped", mesh=procs.proc_mesh)
        await _until_ready(procs)
        args_now = await _ready_arguments(args, kwargs)
        up = await _spawn_actors(
            rt, procs, name, cls, *args_now, per_proc=per_proc,
            failed=lambda errors: _actorwatch.init_failed(name, cls, errors, on_death),
        )  # fmt: skip
        assert mesh._gate is not None
        mesh._gate.fill(up._refs)
        _actorwatch.watch(rt, up, on_death)

    _launch(mesh, work)
    return mesh


def spawn_actor_mesh(
    opts: Options[A], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> ActorMesh[A]:
    """``Cls.options(...).as_actor(...)``: the mesh now; procs then actors in the background."""
    base = opts.name
    check_mesh_name(base)
    name = f"{base}-{secrets.token_hex(4)}"
    per_proc = getattr(opts, "actors_per_proc", 1)
    shape = Shape({"hosts": opts.hosts, "procs": opts.procs}, list(range(opts.hosts * opts.procs)))
    mesh = _pending_actor_mesh(name, _grouping.actors_shape(shape, per_proc), base, opts.cls)
    mesh._owns_procs = True
    on_death = _actorwatch.handler()
    if opts.detached:  # DetachError now if no agent can outlive this script
        _lookup.external_agents(f"mesh {base!r}")

    async def work(rt: Runtime) -> None:
        args_now = await _ready_arguments(args, kwargs)
        up = await spawn_owned_mesh(
            rt, opts.cls, opts.hosts, opts.procs, base, *args_now, proc_mesh=name,
            per_proc=per_proc, setup=opts.setup,
        )  # fmt: skip
        if opts.detached:
            await _lookup.detach_mesh(rt, base, up)
            mesh._detached = base  # its stop() and a copy's, in an actor: by name
        assert mesh._gate is not None
        mesh._gate.fill(up._refs)
        _actorwatch.watch(rt, up, on_death)

    _launch(mesh, work)
    return mesh


def _pending_actor_mesh(proc_mesh: str, shape: Shape, name: str, cls: type[A]) -> ActorMesh[A]:
    if not (isinstance(cls, type) and issubclass(cls, ActorBase)):
        raise TypeError(f"{cls!r} is not a zmesh.Actor subclass")
    infos = endpoints_of(cls)
    mesh: ActorMesh[A] = ActorMesh(
        name, cls.__qualname__, frozenset(infos), Shape(shape.dims, shape.ranks), [],
        modes=_modes(infos),
    )  # fmt: skip
    mesh.proc_mesh = proc_mesh
    mesh.cls_module = cls.__module__
    return mesh


def _launch(mesh: ProcMesh | ActorMesh[Any], work: Callable[[Runtime], Any]) -> None:
    """Run ``work`` on the caller's runtime; settle ``mesh``'s readiness with its outcome.

    The mesh keeps the running spawn (so nothing collects it) and, for an
    actor mesh, a gate where its calls wait meanwhile.
    """
    ready: Ready[None] = concurrent.futures.Future()
    ready.set_running_or_notify_cancel()
    mesh._ready = ready
    if isinstance(mesh, ActorMesh):
        Gate(ready).join(mesh)

    # Procs of the mesh, for a progress line (actor meshes add "actors" per proc).
    procs = math.prod(n for d, n in mesh._shape.dims.items() if d != "actors")

    async def run(rt: Runtime) -> None:
        mesh._ready_loop = rt.loop
        shown = _progress.start(rt, mesh.proc_mesh, procs)  # on a terminal, after 1 s
        try:
            await work(rt)
        except asyncio.CancelledError:
            if mesh._given_up:  # mesh.stop() while it spawned: "you stopped it"
                err: ZmeshError = ActorStoppedError(
                    "the mesh was stopped while it spawned", mesh=mesh.proc_mesh
                )
            else:
                err = SpawnError(
                    "the spawn was cancelled: its event loop ended", mesh=mesh.proc_mesh
                )
            ready.set_exception(err)
            raise
        except Exception as exc:
            if not isinstance(exc, ZmeshError):
                exc = SpawnError(f"{type(exc).__name__}: {exc}", mesh=mesh.proc_mesh)
            ready.set_exception(exc)
            return
        finally:
            if shown is not None:
                shown.cancel()
        ready.set_result(None)

    rt, home = _runtime.current()
    if home:
        mesh._ready_loop = rt.loop
    mesh._spawning = submit(run)


async def _until_ready(mesh: ProcMesh | ActorMesh[Any]) -> None:
    await asyncio.wrap_future(mesh._ready)


async def _ready_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Wait until no mesh in the arguments is still spawning (each travels by its procs)."""
    while True:
        try:
            Codec.pack(args, kwargs)
        except NotReady as wait:
            await asyncio.wrap_future(wait.ready)
            continue
        except Exception:  # _spawn_actors says what cannot be sent
            pass
        return args, kwargs


async def spawn_owned_mesh(
    rt: Runtime,
    cls: type[A],
    hosts: int,
    procs: int,
    name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    addrs: list[str] | None = None,
    proc_mesh: str | None = None,
    per_proc: int = 1,
    setup: ProcSetup | None = None,
) -> ActorMesh[A]:
    """Start ``hosts x procs`` procs and one actor in each; the mesh owns its procs.

    Args:
        addrs: the agents to place the host slices on (default: the first
            ``hosts`` configured agents, or the embedded default).
        proc_mesh: the procs' mesh name (default: ``name`` and a random suffix).
        per_proc: actors in each proc (more than 1: the mesh's dim ``actors``).
        setup: the procs' environment and working directory (``options(env=, cwd=)``).

    Raises:
        SpawnError: a proc or an actor failed to start; nothing is left running.
    """
    if addrs is None:
        addrs = await rt.loop.run_in_executor(None, _local.agents, hosts)
    if proc_mesh is None:
        proc_mesh = f"{name}-{secrets.token_hex(4)}"
    # Each proc gets its actor as soon as it runs, while the others still start.
    dims = {"hosts": len(addrs), "procs": procs}
    start = ActorStart(rt, proc_mesh, dims, name, cls, args, kwargs, per_proc, INIT_TIMEOUT)
    pm = await _procstart.spawn_procs(
        rt, addrs, {"procs": procs}, name, proc_mesh, setup, on_running=start.send
    )
    try:
        mesh = await _spawn_actors(rt, pm, name, cls, args, kwargs, per_proc, start=start)
    except BaseException:
        await stop_procs(rt, pm._refs)
        raise
    mesh._owns_procs = True
    return mesh


# ------------------------------------------------------------ the work


async def _spawn_actors(
    rt: Runtime,
    procs: ProcMesh,
    name: str,
    cls: type[A],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    per_proc: int = 1,
    failed: Callable[[list[BaseException]], None] | None = None,
    start: ActorStart[A] | None = None,
) -> ActorMesh[A]:
    """The actors of ``procs``, started (or, with ``start``, their start finished)."""
    dims = procs.sizes
    if start is None:
        start = ActorStart(rt, procs.name, dims, name, cls, args, kwargs, per_proc, INIT_TIMEOUT)
    await start.finish(procs._refs, failed)
    members = _grouping.member_refs(procs._refs, per_proc)  # [] for one actor per proc
    infos = endpoints_of(cls)
    shape = _grouping.actors_shape(Shape(dims, procs._shape.ranks), per_proc)
    refs = [r for rs in members for r in rs] if members else procs._refs
    mesh: ActorMesh[A] = ActorMesh(
        name, cls.__qualname__, frozenset(infos), shape, refs, modes=_modes(infos),
    )  # fmt: skip
    mesh.cls_module = cls.__module__
    return mesh


def _modes(infos: dict[str, EndpointInfo]) -> dict[str, int]:
    """Endpoints that do not just return: a generator's window, or 0 for an
    explicit response port (see ``ActorMesh.modes``)."""
    return {n: i.window if i.stream else 0 for n, i in infos.items() if i.stream or i.port}

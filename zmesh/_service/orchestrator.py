"""A detached service: its supervisor in an orchestrator actor on an external agent.

``Cls.options(name="embedder", replicas=2, detached=True).spawn()`` must
outlive the script that runs it, so its ``Supervisor`` cannot run in that
script (as a service's normally does). Instead the script spawns a one-proc
mesh of ``Orchestrator`` on the first configured agent and asks it to make
the service: the supervisor then runs in that proc, the replicas are owned
by it (so a replica killed after the creator exited is respawned by it),
and the agent keeps the orchestrator's mesh past the creator's exit, filed
under ``embedder`` (``zmesh._client.lookup``, ``zmesh._host.detached``).

Every script, the creator too, holds the handle the orchestrator hands out:
a ``Service`` that follows the replica table from the agents, with direct
calls, adverbs, sessions and failover as any handle from elsewhere.
``zmesh stop embedder`` (or ``svc.stop()`` from any script with the same
keys) stops the orchestrator's proc, whose ``__cleanup__`` stops the
replicas (and, were it killed instead, the agents stop what a dead owner
owned).
"""

from __future__ import annotations

import logging
from typing import Any

from zmesh._actor import Actor, endpoint
from zmesh._client.faults import MeshFailure
from zmesh._client.future import Future
from zmesh._client.lookup import detach, ensure_free, external_agents, on_home, stop_name
from zmesh._client.mesh import ActorMesh
from zmesh._client.runtime import Runtime
from zmesh._client.spawning import spawn_owned_mesh
from zmesh._client.stopping import stop_procs
from zmesh._errors import SpawnError, ZmeshError
from zmesh._options import Options
from zmesh._service.service import Service, spawn_service

log = logging.getLogger("zmesh.service")


class Orchestrator(Actor):
    """Runs one detached service's supervisor in its proc."""

    def __init__(self) -> None:
        self.svc: Service | None = None

    @endpoint
    async def start_service(
        self,
        cls: type[Actor],
        sizes: dict[str, Any],
        name: str,
        settings: dict[str, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Service:
        """Spawn the service here; its handle (a value, for the creator)."""
        opts: Options[Any] = Options(cls, name=name, detached=False, **sizes, **settings)
        self.svc = await spawn_service(opts, args, kwargs)
        return self.svc

    @endpoint
    def service_handle(self) -> Service:
        """The service's handle, for ``zmesh.lookup``."""
        if self.svc is None:
            raise SpawnError("the service is not started (yet)")
        return self.svc

    @endpoint
    async def stop_service(self) -> None:
        """Stop every replica (the orchestrator's proc is stopped by its agent next)."""
        if self.svc is not None:
            await self.svc.stop()

    def __supervise__(self, failure: MeshFailure) -> bool:
        return True  # the supervisor replaces failed replicas: nothing to escalate

    async def __cleanup__(self, exc: BaseException | None) -> None:
        if self.svc is not None:
            await self.svc.stop()


def spawn_detached(opts: Options[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``Cls.options(replicas=..., detached=True).spawn()``: a future of the ``Service``.

    Raises:
        DetachError: no external agent is configured (at once), or the
            agent refused to keep it (from the future).
        SpawnError: the orchestrator or a replica could not be started;
            nothing is left running.
    """
    agents = external_agents(f"service {opts.name!r}")

    async def go(rt: Runtime) -> Service:
        await ensure_free(rt, opts.name, f"service {opts.name!r}")
        orch: ActorMesh[Orchestrator] = await spawn_owned_mesh(
            rt, Orchestrator, 1, 1, opts.name, (), {}, agents[:1]
        )
        try:
            sizes = {"procs": opts.procs, "hosts": opts.hosts, "replicas": opts.replicas}
            svc: Service = await orch.start_service.call_one(
                opts.cls, sizes, opts.name, opts.service_config, args, kwargs
            )
            await detach(rt, opts.name, "service", orch, orch._refs)
        except BaseException as exc:
            await stop_procs(rt, orch._refs)  # its cleanup stops what it started
            if isinstance(exc, ZmeshError) and not isinstance(exc, SpawnError):
                raise SpawnError(f"service {opts.name!r}: {exc}", mesh=opts.name) from exc
            raise
        return _as_detached(svc, opts.name, orch)

    return on_home(go)


async def attach(name: str, orch: ActorMesh[Orchestrator], addr: str) -> Service:
    """The handle of the detached service ``name`` whose orchestrator is ``orch``."""
    svc: Service = await orch.service_handle.call_one()
    return _as_detached(svc, name, orch)


def _as_detached(svc: Service, name: str, orch: ActorMesh[Orchestrator]) -> Service:
    svc._detached = (name, orch)
    return svc


def stop_detached(svc: Service) -> Future[None]:
    """``svc.stop()`` of a detached service, from any script with its keys."""
    name, orch = svc._detached  # type: ignore[misc]

    async def go(rt: Runtime) -> None:
        try:
            await orch.stop_service.call_one()  # replicas first, cleanly
        except ZmeshError as exc:  # gone already: its agent stops what is left
            log.info("orchestrator of %s: %s", name, exc)
        await stop_name(rt, name, sorted({r.agent for r in orch._refs}))
        for client in list(svc._clients.values()):
            client.rt.loop.call_soon_threadsafe(client.stop)  # calls after this: stopped

    return on_home(go)

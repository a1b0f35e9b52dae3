"""A detached service's supervisor, and how a restarted orchestrator takes over.

A detached service's replicas must outlive its orchestrator, so that a
``kill -9`` of the orchestrator costs the callers nothing (their calls go
straight to the replicas) and the agent can restart it
(``zmesh._host.agent.restarter``). ``DetachedSupervisor`` is a ``Supervisor``
that files each replica it spawns with the service's name on the replica's
agents (``Detach(join=True)``): the agents keep it when its owner, the
orchestrator, dies.

A restarted orchestrator first asks every configured agent to hand it what
is filed under the name (``adopt``): the agents make it the owner of those
meshes and give back the last replica table the old orchestrator reported.
Replicas that were healthy then are adopted as they are (same processes,
same state, same generation, so handles elsewhere see no change); the
others are spawned anew with the next generation; meshes the table no
longer names (a replacement the old orchestrator had not finished) are
stopped.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING, Any

from zmesh._client.calls.runtime import ProcRef, Runtime
from zmesh._client.control import local as _local
from zmesh._client.control.lookup import principal
from zmesh._client.control.stopping import stop_request
from zmesh._client.handles.mesh import ActorMesh
from zmesh._errors import ZmeshError
from zmesh._service.client import ServiceClient, TableRow, decode_table
from zmesh._service.routing import HEALTHY, UNHEALTHY
from zmesh._service.supervisor import Supervisor
from zmesh._shared.points import Shape
from zmesh._wire import messages as w

if TYPE_CHECKING:
    from zmesh._options import Options

log = logging.getLogger("zmesh.service")

ADOPT_TIMEOUT = 10.0


class DetachedSupervisor(Supervisor):
    """A ``Supervisor`` whose replicas are kept by their agents past it.

    Args:
        adopted: replicas taken over from a dead orchestrator, by index:
            they are used instead of spawned.
        last: the dead orchestrator's last table: a replica spawned anew
            gets the generation after its row's, and keeps its restarts.
    """

    def __init__(
        self,
        rt: Runtime,
        client: ServiceClient,
        opts: Options[Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        service_id: str,
        adopted: dict[int, tuple[int, ActorMesh[Any]]],
        last: list[TableRow],
    ) -> None:
        super().__init__(rt, client, opts, args, kwargs, service_id)
        self._adopted = dict(adopted)
        self._restarted = bool(last)
        self._given_up: set[int] = set()  # UNHEALTHY in the last table: they stay down
        for row in last:
            if row.index < len(self._generations):
                self._generations[row.index] = row.generation
                slot = client.dispatcher.slots[row.index]
                slot.restarts = row.restarts
                slot.last_failure = row.last_failure
                if row.state == UNHEALTHY:
                    self._given_up.add(row.index)

    async def start(self) -> None:
        """A first start spawns every replica (all or nothing, as any service).

        A restarted orchestrator takes over: the adopted replicas serve at
        once, one that was given up stays down, and one that cannot be
        spawned now is recovered as a failed replica (backoff, restart
        intensity) rather than failing the start, which would stop the
        healthy ones with it.
        """
        if not self._restarted:
            await super().start()
            return

        async def take(index: int) -> None:
            if index in self._given_up:
                self.client.replica_gone(index)
                return
            try:
                await self._spawn(index)
            except Exception as exc:
                slot = self.client.dispatcher.slots[index]
                slot.last_failure = f"respawn failed: {exc}"
                log.warning("service %s replica %d: %s", self.name, index, slot.last_failure)
                self._spawn_task(self._recover(index, None))

        await asyncio.gather(*(take(i) for i in range(self.opts.replicas)))
        self._spawn_task(self.health.run())
        self._spawn_task(self._report_loop())
        self.report()

    async def _spawn(self, index: int) -> None:
        taken = self._adopted.pop(index, None)
        if taken is not None:
            generation, mesh = taken
            self._agents.update(r.agent for r in mesh._refs)
            self._generations[index] = generation
            self.client.set_replica(index, generation, mesh)
            self.report()
            return
        await super()._spawn(index)
        spawned = self.client.meshes[index]
        if spawned is not None and not self.stopped:
            await file_replica(self.rt, self.name, self.service_id, spawned._refs)


async def file_replica(rt: Runtime, name: str, service_id: str, refs: list[ProcRef]) -> None:
    """File a replica's procs with the service's name, so its agents keep them."""

    by_agent: dict[str, set[str]] = {}
    for ref in refs:
        by_agent.setdefault(ref.agent, set()).add(ref.mesh)
    for addr, meshes in sorted(by_agent.items()):
        make = functools.partial(
            w.Detach, name=name, meshes=sorted(meshes), principal=principal(), kind="service",
            handle=b"", secret=_local.owner_secret(), join=True, service=service_id,
        )  # fmt: skip
        try:
            await rt.controller.agent(addr).request(make, timeout=ADOPT_TIMEOUT)
        except ZmeshError as exc:  # it still serves; it just dies with this orchestrator
            log.warning("service %s: replica %s not kept past its orchestrator: %s",
                        name, sorted(meshes), exc)  # fmt: skip


async def adopt(
    rt: Runtime, name: str, cls_name: str, endpoints: frozenset[str]
) -> tuple[dict[int, tuple[int, ActorMesh[Any]]], list[TableRow]]:
    """Take over what a dead orchestrator of ``name`` left: ``(adopted, last table)``.

    Nothing is left on a first start: ``({}, [])``.
    """

    owned: set[str] = set()
    last: list[TableRow] = []
    for addr in _local.configured_agents() or []:
        make = functools.partial(
            w.Adopt, name=name, principal=principal(), owner=_local.owner_id(),
            secret=_local.owner_secret(),
        )  # fmt: skip
        try:
            reply = await rt.controller.agent(addr).client.request(
                make, timeout=ADOPT_TIMEOUT, check=False
            )
        except ZmeshError as exc:
            log.warning("service %s: agent %s cannot hand over its replicas: %s", name, addr, exc)
            continue
        if not reply.ok:
            continue
        if reply.meshes:
            _local.note_used(addr)  # ours now: heartbeat to it
        for adopted_mesh, key in zip(reply.meshes, reply.keys, strict=False):
            _local.hold_key(adopted_mesh, key)  # what their procs take a stop of actors with
        owned.update(reply.meshes)
        if reply.table:
            rows = decode_table(reply.table)
            if sum(r.generation for r in rows) > sum(r.generation for r in last):
                last = rows
    adopted: dict[int, tuple[int, ActorMesh[Any]]] = {}
    for row in last:
        if row.state == HEALTHY and row.refs and all(r.mesh in owned for r in row.refs):
            shape = Shape(row.dims or {"procs": len(row.refs)}, [r.rank for r in row.refs])
            mesh: ActorMesh[Any] = ActorMesh(row.actor, cls_name, endpoints, shape, list(row.refs))
            mesh._owns_procs = True
            adopted[row.index] = (row.generation, mesh)
    used = {r.mesh for _, m in adopted.values() for r in m._refs}
    stale = sorted(owned - used)
    if stale:  # not in the table (a replacement under way): not ours to keep
        log.info("service %s: stopping what its last table does not name: %s", name, stale)
        await _stop_meshes(rt, stale)
    if adopted:
        log.info("service %s: adopted replicas %s", name, sorted(adopted))
    return adopted, last


async def _stop_meshes(rt: Runtime, names: list[str]) -> None:
    for addr in _local.configured_agents() or []:
        for mesh in names:
            try:
                await rt.controller.agent(addr).client.request(
                    stop_request(mesh), timeout=ADOPT_TIMEOUT, check=False
                )
            except ZmeshError:
                continue

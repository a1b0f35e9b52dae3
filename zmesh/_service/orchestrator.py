"""A detached service: its supervisor in an orchestrator actor on an external agent.

``Cls.options(name="embedder", replicas=2, detached=True).spawn()`` must
outlive the script that runs it, so its ``Supervisor`` cannot run in that
script (as a service's normally does). Instead the script spawns a one-proc
mesh of ``Orchestrator`` on the first configured agent, whose one argument
is the service's ``Plan``: the orchestrator makes the service there, owns
the replicas (so a replica killed after the creator exited is respawned by
it), and the agent keeps the orchestrator's mesh past the creator's exit,
filed under ``embedder`` (``zmesh._client.control.lookup``, ``zmesh._host.agent.detached``).

The orchestrator is not in the calls' path, and nothing dies with it: its
replicas are filed with the name too (``zmesh._service.adoption``), and the
creator files the ``SpawnActor`` that made the orchestrator, so when its
proc dies (``kill -9``) the agent starts it again with the same ``Plan``
(``zmesh._host.agent.restarter``). The new orchestrator takes over the replicas
that were healthy (same processes and state: re-adoption, not re-creation,
so callers notice nothing) and respawns the others.

Every script, the creator too, holds the handle the orchestrator hands out:
a ``Service`` that follows the replica table from the agents, with direct
calls, adverbs, sessions and failover as any handle from elsewhere.
``zmesh stop embedder`` (or ``svc.stop()`` from any script, or actor, that
acts for the same keys: ``zmesh._client.control.lookup.principal``) stops the
orchestrator and every replica.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from zmesh._actor import ActorBase, endpoint, endpoints_of
from zmesh._client.calls import runtime as _runtime
from zmesh._client.calls.future import Future
from zmesh._client.calls.runtime import Runtime
from zmesh._client.control import local as _local
from zmesh._client.control.faults import MeshFailure
from zmesh._client.control.lookup import (
    LOOKUP_TIMEOUT,
    detach,
    ensure_free,
    external_agents,
    find,
    on_home,
)
from zmesh._client.control.spawning import spawn_owned_mesh
from zmesh._client.control.stopping import stop_procs
from zmesh._client.handles.mesh import ActorMesh
from zmesh._errors import ServiceError, SpawnError, ZmeshError
from zmesh._service import service as _service
from zmesh._service import signatures
from zmesh._service.adoption import DetachedSupervisor, adopt
from zmesh._service.client import ServiceClient
from zmesh._service.routing import ServiceConfig, make_router
from zmesh._service.service import Service
from zmesh._shared.state import Status
from zmesh._wire import messages as w
from zmesh._wire import pickling
from zmesh._wire.codec import Codec

if TYPE_CHECKING:
    from zmesh._options import Options

log = logging.getLogger("zmesh.service")


@dataclass
class Plan:
    """What a detached service is made of: the orchestrator's one argument,
    the same for every start of it (the agent's restarts too)."""

    opts: Options[Any]  # as the creator's script checked them
    service_id: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    # Each endpoint's parameters and types, packed where the class is defined
    # (zmesh._service.signatures): they travel in the handle, for zmesh http.
    signatures: dict[str, bytes] = field(default_factory=dict)

    @property
    def cls(self) -> type[ActorBase]:
        return self.opts.cls

    @property
    def name(self) -> str:
        return self.opts.name


class Orchestrator(ActorBase):
    """Runs one detached service's supervisor in its proc.

    It starts the service as it is built (a first start spawns the
    replicas, a restart adopts them first); ``service_handle`` waits for that.
    """

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.svc: Service | None = None
        self._up: Future[Service] = on_home(self._start)

    async def _start(self, rt: Runtime) -> Service:
        p = self.plan
        opts = p.opts
        config = ServiceConfig(**opts.service_config)
        endpoints = signatures.sign(endpoints_of(p.cls), p.signatures)
        svc = Service(
            p.service_id, p.name, p.cls.__qualname__, endpoints, opts.replicas, config,
            make_router(config.router),
        )  # fmt: skip
        client = ServiceClient(
            rt, svc.name, svc._n, config, svc.router, svc.cls_name, frozenset(svc.endpoints)
        )
        svc._clients[id(rt)] = _service._clients[(svc.id, id(rt))] = client
        adopted, last = await adopt(rt, p.name, svc.cls_name, frozenset(endpoints))
        sup = DetachedSupervisor(rt, client, opts, p.args, p.kwargs, svc.id, adopted, last)
        svc._supervisor = _service._supervisors[svc.id] = sup
        await sup.start()
        self.svc = svc
        return svc

    @endpoint
    async def service_handle(self) -> Service:
        """The service's handle, once it runs (for the creator and ``zmesh.lookup``)."""
        try:
            return await self._up
        except ZmeshError:
            raise
        except Exception as exc:
            raise SpawnError(f"service {self.plan.name!r}: {exc!r}", mesh=self.plan.name) from exc

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
    plan = Plan(
        opts, f"{opts.name}-{secrets.token_hex(6)}", args, kwargs, signatures.pack(opts.cls)
    )

    async def go(rt: Runtime) -> Service:
        await ensure_free(rt, opts.name, f"service {opts.name!r}")
        orch: ActorMesh[Orchestrator] = await spawn_owned_mesh(
            rt, Orchestrator, 1, 1, opts.name, (plan,), {}, agents[:1]
        )
        # Its agent restarts it when it fails: nothing for this script to do.
        rt.controller.handlers[orch.proc_mesh] = lambda event: True
        try:
            await detach(
                rt, opts.name, "service", orch, orch._refs, boot=_boot_frames(orch, plan),
                service=plan.service_id,
            )  # fmt: skip
            svc: Service = await orch.service_handle.call_one()
        except BaseException as exc:
            await stop_procs(rt, orch._refs)  # its cleanup stops what it started
            if isinstance(exc, ZmeshError) and not isinstance(exc, SpawnError):
                raise SpawnError(f"service {opts.name!r}: {exc}", mesh=opts.name) from exc
            raise
        return _as_detached(svc, opts.name, orch)

    return on_home(go)


def _boot_frames(orch: ActorMesh[Orchestrator], plan: Plan) -> list[bytes]:
    """The frames of the ``SpawnActor`` that made ``orch``: its agent restarts it with them."""
    blob, _ = pickling.dumps(Orchestrator, lambda _: True)
    payload, buffers = Codec.pack((plan,), {})
    proof = _local.mesh_proof(orch.proc_mesh)  # the restarted proc checks it as any spawn
    msg = w.SpawnActor(1, orch.actor, blob, payload, orch.proc_mesh, orch.sizes, 0, proof=proof)
    return [bytes(f) for f in Codec(w.PROC_INBOX).encode(msg, buffers)]


async def attach(name: str, orch: ActorMesh[Orchestrator], addr: str) -> Service:
    """The handle of the detached service ``name`` whose orchestrator is ``orch``.

    An orchestrator its agent is restarting is waited for (``LOOKUP_TIMEOUT``).

    Raises:
        ServiceError: the orchestrator did not answer in time (the last error says why).
        NameNotFoundError: the service was stopped meanwhile.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 3 * LOOKUP_TIMEOUT
    while True:
        try:
            current = await _current(orch)
            svc: Service = await current.service_handle.options(timeout=LOOKUP_TIMEOUT).call_one()
            return _as_detached(svc, name, current)
        except ZmeshError as exc:
            if loop.time() > deadline:
                raise ServiceError(
                    f"the orchestrator of detached service {name!r} does not answer: {exc.message}",
                    mesh=name, host=addr,
                ) from exc  # fmt: skip
            # Not running: being restarted, or the service was stopped meanwhile
            # (then its name is gone, and waiting would only run into the deadline).
            _, handle, addr = await find(_runtime.home(), name)  # NameNotFoundError: stopped
            orch = handle
        await asyncio.sleep(0.2)


async def _current(orch: ActorMesh[Orchestrator]) -> ActorMesh[Orchestrator]:
    """``orch`` at the generation its agent runs now (it restarts a failed one)."""
    rt = _runtime.home()
    ctl = rt.controller
    ref = orch._refs[0]
    ctl.handlers[ref.mesh] = lambda event: True  # its agent restarts it: nothing to do here
    reply = await ctl.agent(ref.agent).request(
        lambda i: w.GetState(i, ref.mesh), timeout=LOOKUP_TIMEOUT
    )
    for mesh in reply.meshes:
        for rank in mesh.ranks:
            if mesh.name == ref.mesh and rank.rank == ref.rank:
                if rank.status is not Status.RUNNING:
                    raise ServiceError(f"orchestrator {ref.mesh} is {rank.status.value}")
                if rank.generation == ref.generation:
                    return orch
                new = msgspec.structs.replace(
                    ref, generation=rank.generation, addr=rank.addr, log_path=rank.log_path
                )
                # The dead generation's tombstone would fail calls to this one;
                # calls on a handle of the dead one still fail (a newer one runs).
                ctl.tombstones.pop(ref.mesh, None)
                ctl.handlers[ref.mesh] = lambda event: True
                return ActorMesh(orch.actor, orch.cls_name, orch.endpoints, orch._shape, [new])
    raise ServiceError(f"agent {ref.host} has no orchestrator {ref.mesh}")


def _as_detached(svc: Service, name: str, orch: ActorMesh[Orchestrator]) -> Service:
    svc._detached = (name, orch)
    return svc

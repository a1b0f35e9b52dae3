"""Detached services and meshes: filing them by name, and ``zmesh.lookup``.

``Cls.options(name="embedder", detached=True).spawn()`` on external agents
(``zmesh agent``, ``zmesh cluster``, ``zmesh up``) files what it made on its
agents under ``embedder`` (``detach``): the agents keep it when the script
exits (``zmesh._host.agent.detached``). Another script with the same agents and
keys attaches with ``zmesh.lookup("embedder")`` and gets a ``Service`` or
an ``ActorMesh``; ``zmesh stop embedder`` or ``svc.stop()`` ends it.

Names are per key pair: ``principal()`` is a token derived from this
client's CURVE secret key (``""`` without keys, where only this user can
reach the agent at all: ipc://). It goes to the agents only, over the
encrypted control connection; without the secret key nobody can make it.

An actor acts for the key pair of the script that spawned its proc (or
spawned the actor that spawned it, and so on): the script hands its token to
the procs it starts (``PRINCIPAL_VAR`` in their environment, which the
agents never publish), so inside an actor ``zmesh.lookup`` finds that
script's names, a handle passed in may stop them, and what the actor makes
``detached`` is filed for the same keys, not for the agents' key pair that
its proc connects with. A handle that reaches an actor of other keys may
call the service but not stop it (``NameNotFoundError``).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import os
import pickle
from collections.abc import Awaitable, Callable
from typing import Any

from zmesh._client.calls import runtime as _runtime
from zmesh._client.calls.future import Future
from zmesh._client.calls.runtime import ProcRef, Runtime
from zmesh._client.control import local as _local
from zmesh._client.control.agentconn import agent_ready
from zmesh._client.control.stopping import stop_procs
from zmesh._errors import (
    AgentError,
    DetachError,
    NameNotFoundError,
    SecurityError,
    ServiceError,
    ZmeshError,
)
from zmesh._shared.aio import running_loop
from zmesh._shared.state import Status
from zmesh._wire import messages as w
from zmesh._wire import security as _security
from zmesh._wire.boundary import PROC_ENV_VAR

LOOKUP_TIMEOUT = 10.0
LOST_TIMEOUT = 1.0  # for an agent this client has found silent (its host lost)
# The principal of the script a proc works for, set by the script in its procs'
# environment (``zmesh._client.control.procstart.proc_spec``).
PRINCIPAL_VAR = "ZMESH_PRINCIPAL"


def principal() -> str:
    """Whose names this client's are: a token of its CURVE secret key (``""``: no keys).

    In a proc (an actor), the token of the script it works for.
    """
    if os.environ.get(PROC_ENV_VAR):
        inherited = os.environ.get(PRINCIPAL_VAR)
        if inherited is not None:
            return inherited
    keys = _security.active()
    if keys is None:
        return ""
    return hmac.new(keys.secret, b"zmesh detached names", hashlib.sha256).hexdigest()


def external_agents(what: str) -> list[str]:
    """The configured agents, for something ``detached``.

    Raises:
        DetachError: none is configured: the embedded default agent would
            be used, and it ends with this script.
    """
    agents = _local.configured_agents()
    if agents is None:
        raise DetachError(
            f"{what}: detached=True needs an agent that outlives this script, but none is "
            "configured, so the embedded agent would run it and stop it when the script "
            "exits. Start one ('zmesh agent', 'zmesh cluster' or 'zmesh up') and point "
            "ZMESH_AGENTS (or zmesh.connect) at it"
        )
    return agents


def on_home(work: Callable[[Runtime], Awaitable[Any]]) -> Future[Any]:
    """Run ``work(rt)`` on the runtime's I/O loop; its ``Future``."""
    rt = _runtime.home()
    if running_loop() is rt.loop:
        return Future(afut=rt.loop.create_task(work(rt)))  # type: ignore[arg-type]
    return Future(cfut=asyncio.run_coroutine_threadsafe(work(rt), rt.loop))  # type: ignore[arg-type]


async def detach(
    rt: Runtime,
    name: str,
    kind: str,
    handle: Any,
    refs: list[ProcRef],
    boot: list[bytes] | None = None,
    service: str = "",
) -> None:
    """File the proc meshes of ``refs`` under ``name`` on their agents, with ``handle``.

    ``boot``: the frames of the ``SpawnActor`` the agent restarts a failed
    rank with (a service's orchestrator); ``service``: its id.

    Raises:
        DetachError: an agent refused (an embedded agent, the name is taken).
    """
    blob = pickle.dumps(handle)
    by_agent: dict[str, set[str]] = {}
    for ref in refs:
        by_agent.setdefault(ref.agent, set()).add(ref.mesh)
    for addr, meshes in sorted(by_agent.items()):
        make = functools.partial(
            w.Detach, name=name, meshes=sorted(meshes), principal=principal(), kind=kind,
            handle=blob, secret=_local.owner_secret(), boot=boot or [], service=service,
        )  # fmt: skip
        try:
            await rt.controller.agent(addr).request(make, timeout=LOOKUP_TIMEOUT)
        except AgentError as exc:
            raise DetachError(f"{kind} {name!r} cannot be detached: {exc.message}",
                              mesh=name, host=addr) from exc  # fmt: skip


async def find(rt: Runtime, name: str) -> tuple[str, Any, str]:
    """``(kind, handle, agent)`` of ``name`` on the configured agents.

    Raises:
        NameNotFoundError: no agent has ``name`` for our keys (the message
            lists the names that exist).
        ServiceError: ``name`` is a service whose orchestrator its agent no
            longer restarts (past its restart limit), or whose replicas run
            but whose orchestrator's agent does not answer (its host is
            lost): nothing can hand out its handle.
        AgentError, SecurityError: no agent could be asked (the first error).
    """
    agents = _local.configured_agents()
    if agents is None:
        raise NameNotFoundError(
            f"no detached service or mesh named {name!r}: no agents are configured (detached "
            "ones live on external agents: set ZMESH_AGENTS or call zmesh.connect)",
            name=name,
        )

    names: set[str] = set()
    errors: list[ZmeshError] = []
    holders: list[str] = []  # agents that keep replicas of ``name`` (its orchestrator is elsewhere)
    for addr in agents:
        conn = rt.controller.agent(addr)
        try:
            await agent_ready(rt, conn.ready, addr)
            reply = await conn.client.request(
                functools.partial(w.Lookup, name=name, principal=principal()),
                # One whose heartbeats stopped gets a moment, not the whole wait.
                timeout=LOST_TIMEOUT if conn.lost else LOOKUP_TIMEOUT, check=False,
            )  # fmt: skip
        except (AgentError, SecurityError) as exc:
            errors.append(exc)
            continue
        if not isinstance(reply, w.LookupReply):  # its decoder refused the request (an Ack)
            why = getattr(reply, "error", "") or f"answered {type(reply).__name__}"
            errors.append(AgentError(f"agent {addr} cannot look {name!r} up: {why}", host=addr))
            continue
        if reply.ok and reply.down:
            raise ServiceError(
                f"detached service {name!r} cannot be attached to: {reply.down}",
                mesh=name, host=addr, log_path=reply.log_path or None,
            )  # fmt: skip
        if reply.ok:
            return reply.kind, pickle.loads(reply.handle), addr
        names.update(reply.names)
        if reply.replicas:
            holders.append(addr)
    if holders:  # the replicas run, but the agent that keeps the orchestrator does not answer
        why = f" ({errors[0].message})" if errors else ""
        raise ServiceError(
            f"detached service {name!r} cannot be attached to: no agent that answers keeps its "
            f"orchestrator{why}; its replicas on {', '.join(holders)} keep serving the handles "
            f"that have them; 'zmesh stop {name}' ends them",
            mesh=name, host=errors[0].host if errors else holders[0],
        )  # fmt: skip
    if errors and len(errors) == len(agents):
        raise errors[0]
    known = ", ".join(sorted(names)) or "none"
    raise NameNotFoundError(
        f"no detached service or mesh named {name!r} for your keys on {len(agents)} "
        f"agent(s) (names there: {known})",
        name=name, names=sorted(names),
    )  # fmt: skip


async def ensure_free(rt: Runtime, name: str, what: str) -> None:
    """Refuse, before anything is spawned, a name that is ours already.

    Raises:
        DetachError: a detached service or mesh of ours has that name.
    """
    try:
        kind, _handle, addr = await find(rt, name)
    except NameNotFoundError:
        return
    except ServiceError as exc:  # ours, with its orchestrator down: taken all the same
        raise DetachError(f"{what}: {name!r} is a detached service already: {exc.message}",
                          mesh=name, host=exc.host) from exc  # fmt: skip
    raise DetachError(
        f"{what}: {name!r} is a detached {kind} already (on {addr}): use "
        f"zmesh.lookup({name!r}), or 'zmesh stop {name}' first, or choose another name",
        mesh=name,
    )


async def stop_name(rt: Runtime, name: str, agents: list[str]) -> None:
    """Ask ``agents`` to stop what is filed under ``name`` (ours).

    Raises:
        NameNotFoundError: none of them had it (stopped already, or not ours).
    """
    stopped = False
    for addr in agents:
        make = functools.partial(w.StopDetached, name=name, principal=principal())
        try:
            conn = rt.controller.agent(addr).client
            ack = await conn.request(make, timeout=LOOKUP_TIMEOUT, check=False)
        except AgentError:
            continue
        stopped = stopped or bool(ack.ok)
    if not stopped:
        raise NameNotFoundError(
            f"no detached service or mesh named {name!r} of yours to stop", name=name
        )


def detached_names() -> Future[list[str]]:
    """The names of the detached services and meshes of our keys on the configured agents.

    Raises (from the future):
        SecurityError, AgentError: no configured agent could be asked.
    """

    async def go(rt: Runtime) -> list[str]:
        try:  # no name is "": the agents answer with the names they have
            await find(rt, "")
        except NameNotFoundError as exc:
            return exc.names
        return []

    return on_home(go)


def stop_detached_mesh(mesh: Any) -> Future[None]:
    """``mesh.stop()`` of a detached mesh: its procs, by name, for our keys.

    The agents stop what is filed under the name (every proc of the mesh)
    only for the key pair that filed it, so a handle that reached other keys
    cannot stop it.

    Raises (from the future):
        NameNotFoundError: not ours (other keys), or stopped already.
    """

    async def go(rt: Runtime) -> None:
        await stop_name(rt, mesh._detached, sorted({r.agent for r in mesh._refs}))
        ctl = rt.controller
        for ref in mesh._refs:  # calls after this fail at once, as after an owner's stop
            ctl.watch(ref)
            ctl.judge(ctl.agent(ref.agent), ref.mesh, ref.rank, Status.STOPPING, "")

    return on_home(go)


async def detach_mesh(rt: Runtime, name: str, mesh: Any) -> None:
    """File a just-spawned actor mesh under ``name``; stop it if its agents refuse."""
    try:
        await detach(rt, name, "mesh", mesh, mesh._refs)
    except BaseException:
        await stop_procs(rt, mesh._refs)
        raise

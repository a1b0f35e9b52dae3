"""Procs through their agents: ``CreateOrUpdate`` on each, then wait for Running.

``spawn_procs`` asks every agent of a new proc mesh for its ranks, waits until
each rank runs (or fails, with the end of its log), and returns the
``ProcMesh`` with a connection to every proc. ``zmesh._client.control.spawning``
starts actors in them; ``zmesh._client.control.named`` updates a named mesh in place.
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import secrets
import sys
from collections.abc import Callable
from typing import Any

from zmesh._actor import owner_actor as _owner_actor
from zmesh._client.calls.runtime import ProcRef, Runtime
from zmesh._client.control import controller as _controller
from zmesh._client.control import faults as _faults
from zmesh._client.control import local as _local
from zmesh._client.control import lookup as _lookup
from zmesh._client.control.agentconn import agent_ready
from zmesh._client.control.procsetup import ProcSetup
from zmesh._client.control.stopping import stop_mesh_on
from zmesh._client.handles.mesh import ProcMesh, check_mesh_name
from zmesh._errors import SpawnError
from zmesh._shared.points import Shape
from zmesh._shared.procbind import BOOTSTRAP_VAR, CWD_VAR, PROC_BIND_VAR
from zmesh._shared.state import Status
from zmesh._wire import messages as w

# How long procs may take to start (to Running, or a failure).
SPAWN_TIMEOUT = float(os.environ.get("ZMESH_SPAWN_TIMEOUT", "120"))


async def spawn_procs(
    rt: Runtime,
    addrs: list[str],
    per_host: dict[str, int],
    base: str,
    name: str | None = None,
    setup: ProcSetup | None = None,
    on_running: Callable[[ProcRef], None] | None = None,
) -> ProcMesh:
    """Start the procs of a new mesh on ``addrs`` and wait until every rank runs.

    Args:
        on_running: called with each proc's ref as soon as its rank runs
            (``zmesh._client.control.actorstart`` sends it its actor then).

    Raises:
        SpawnError: a rank failed or did not start in time (the mesh is stopped).
    """
    check_mesh_name(base)
    if name is None:
        name = f"{base}-{secrets.token_hex(4)}"
    ctl = rt.controller
    ctl.creating.add(name)  # not released while it starts, even if a rank fails
    try:
        return await _start_procs(rt, addrs, per_host, name, setup, on_running)
    except BaseException:
        ctl.release(name)  # stopped already (or never made): nothing of it stays
        raise
    finally:
        ctl.creating.discard(name)


async def _start_procs(
    rt: Runtime,
    addrs: list[str],
    per_host: dict[str, int],
    name: str,
    setup: ProcSetup | None,
    on_running: Callable[[ProcRef], None] | None = None,
) -> ProcMesh:
    dims = {"hosts": len(addrs), **per_host}
    per = math.prod(per_host.values())
    if per < 1:
        raise SpawnError(f"per_host sizes must be at least 1, got {per_host}")
    spec_of = proc_spec(dims, setup)
    ctl = rt.controller
    owner_actor = _owner_actor()
    if owner_actor is not None:
        # Unhandled, the owner actor fails (not its whole proc), as in Monarch.
        ctl.handlers[name] = functools.partial(_faults.owner_handles, owner_actor)
    elif not _controller.ESCALATE_UNHANDLED:  # the client owns it: zmesh.unhandled_fault_hook
        ctl.handlers[name] = _faults.client_handler(ctl)
    conns = []
    for h, addr in enumerate(addrs):
        agent = ctl.agent(addr)
        await agent_ready(rt, agent.ready, addr)
        _local.note_used(addr)
        ranks = list(range(h * per, (h + 1) * per))
        ctl.track(name, agent, ranks)
        conns.append((agent, ranks))
    try:
        await _create_and_wait(rt, name, conns, spec_of, on_running)
    except asyncio.CancelledError:
        # The caller gave up on the spawn: the procs it asked for must not stay.
        await asyncio.shield(stop_mesh_on(rt, name, conns))
        raise
    ctl.owned.add(name)  # from now on, its unhandled failures are ours
    return proc_mesh_of(ctl, name, dims, conns)


# Our own variables that are not the procs' to inherit: a proc's own spec,
# and a setup (a proc that spawns a mesh gives that mesh its own).
_NOT_PASSED = frozenset({"ZMESH_PROC", BOOTSTRAP_VAR, PROC_BIND_VAR, CWD_VAR})


def proc_spec(
    dims: dict[str, int], setup: ProcSetup | None = None
) -> Callable[[int, list[int]], w.ProcSpec]:
    """``(host index, ranks) -> ProcSpec``: what this client's procs start with
    (and ``setup``'s environment, working directory, bootstrap and CPUs)."""
    # A cwd of the setup's own is entered by the proc (zmesh._host.proc.procsetup).
    own_cwd = setup is not None and setup.cwd is not None
    prep = w.MainSpec(sys_path=list(sys.path), dir="" if own_cwd else os.getcwd())
    env = {
        k: v for k, v in os.environ.items() if k.startswith("ZMESH_") and k not in _NOT_PASSED
    }  # fmt: skip
    if setup is not None:
        env.update(setup.to_env())
    agents = _local.configured_agents()
    if agents is not None:  # zmesh.connect(): procs spawn on the same agents
        env["ZMESH_AGENTS"] = ",".join(agents)

    principal = _lookup.principal()  # whose detached names its actors act for
    if principal:
        env[_lookup.PRINCIPAL_VAR] = principal
    return lambda h, ranks: w.ProcSpec(
        owner=_local.owner_id(), ranks=ranks, dims=dims, host_index=h, main=prep, env=env
    )


def proc_mesh_of(
    ctl: _controller.Controller, name: str, dims: dict[str, int], conns: list[Any]
) -> ProcMesh:
    """The ``ProcMesh`` of ``conns``' ranks (``[(agent, ranks)]``) as the view has them."""
    view = ctl.views[name]
    refs = [_ref(name, r, view.ranks[r], agent) for agent, ranks in conns for r in ranks]
    return ProcMesh(name, Shape(dims, list(range(len(refs)))), refs)


def _ref(name: str, rank: int, st: Any, agent: Any) -> ProcRef:
    """The ref of ``name[rank]``, in state ``st``, on ``agent``."""
    return ProcRef(name, rank, st.generation, st.addr, agent.addr, agent.label, st.log_path)


async def _create_and_wait(
    rt: Runtime,
    name: str,
    conns: list[Any],
    spec_of: Callable[[int, list[int]], w.ProcSpec],
    on_running: Callable[[ProcRef], None] | None = None,
) -> None:
    """Ask each agent for its host slice, then wait until every rank is Running
    (``on_running`` hears of each as it is).

    Raises:
        SpawnError: a rank failed or did not start in time (the mesh is stopped).
    """
    ctl = rt.controller
    await asyncio.gather(
        *(
            a.request(
                functools.partial(
                    w.CreateOrUpdate, name=name, spec=spec_of(h, r), secret=_local.owner_secret()
                )
            )
            for h, (a, r) in enumerate(conns)
        )
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SPAWN_TIMEOUT
    agent_of = {r: a for a, ranks in conns for r in ranks}
    told: set[int] = set()  # ranks on_running has had
    while True:
        view = ctl.views[name]
        now_ranks = sorted(view.ranks.items())
        bad = [(r, s) for r, s in now_ranks if s.status.failure or s.status.terminal]
        if bad:
            await stop_mesh_on(rt, name, conns)
            rank, st = bad[0]
            raise SpawnError(
                f"proc failed to start: {st.status.value} ({st.reason}){log_tail(st.log_path)}",
                mesh=name, rank=rank, host=ctl.hosts[(name, rank)].label,
                log_path=st.log_path or None,
            )  # fmt: skip
        if on_running is not None:
            for r, s in now_ranks:
                if r not in told and s.status == Status.RUNNING and s.addr:
                    told.add(r)
                    on_running(_ref(name, r, s, agent_of[r]))
        if all(s.status == Status.RUNNING and s.addr for s in view.ranks.values()):
            break
        left = deadline - loop.time()
        if left <= 0:
            await stop_mesh_on(rt, name, conns)
            raise SpawnError(f"procs not ready after {SPAWN_TIMEOUT:.0f}s", mesh=name)
        await ctl.wait_changed(name, min(left, 1.0))


def log_tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, errors="replace") as f:
            text = f.read()[-8192:]
    except OSError:
        return ""
    tail = "\n".join(text.rstrip().splitlines()[-lines:])
    return f"\n--- last lines of {path} ---\n{tail}" if tail else ""

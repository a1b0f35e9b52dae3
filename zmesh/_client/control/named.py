"""Proc meshes spawned under a name of the user's: spawning again updates them.

``HostMesh.spawn_procs(name="workers")`` names the mesh ``workers`` on its
agents (no random suffix). While a ``workers`` of this client runs, a second
``spawn_procs(..., name="workers")`` sends its agents ``CreateOrUpdate`` with
the new spec: the agents grow the mesh (start the new ranks), shrink it (stop
the ranks left out) or roll it, in place (``zmesh._host.agent.updates``). Once the
mesh has its new shape (new ranks Running, dropped ones Stopped), every
``ProcMesh`` handle of it follows: its shape and procs are the new ones.
Actor meshes keep the procs they were spawned on; calls to a rank the mesh
shrank away from fail with ``ActorStoppedError``.

A name whose mesh is over (stopped) is spawned afresh; its agents go on from
its generations. Updates of one name run one after the other.
"""

from __future__ import annotations

import asyncio
import functools
import math
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from zmesh._client.control import local as _local
from zmesh._client.control import procstart as _procstart
from zmesh._client.control.procsetup import ProcSetup
from zmesh._errors import AgentError, SpawnError
from zmesh._shared.state import Status
from zmesh._wire import messages as w

if TYPE_CHECKING:
    from zmesh._client.calls.runtime import Runtime
    from zmesh._client.control.controller import AgentConn, Controller
    from zmesh._client.handles.mesh import ProcMesh

# How long a stopping mesh may take to be over before its name is spawned again.
RELEASE_WAIT = 10.0


@dataclass
class Named:
    """What this client knows of one named proc mesh."""

    addrs: list[str] = field(default_factory=list)
    per: int = 0
    generation: int = 0  # the mesh's spec generation, as its agents last said
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    handles: weakref.WeakSet[ProcMesh] = field(default_factory=weakref.WeakSet)


_named: weakref.WeakKeyDictionary[Controller, dict[str, Named]] = weakref.WeakKeyDictionary()


def _entry(ctl: Controller, name: str) -> Named:
    return _named.setdefault(ctl, {}).setdefault(name, Named())


def _live(ctl: Controller, name: str) -> bool:
    """Whether ``name`` is a mesh of ours that still runs (an update can change it)."""
    view = ctl.views.get(name)
    return (
        view is not None
        and name in ctl.owned
        and any(r.status in (Status.RUNNING, Status.INITIALIZING) for r in view.ranks.values())
    )


async def spawn_or_update(
    rt: Runtime,
    addrs: list[str],
    per_host: dict[str, int],
    name: str,
    handle: ProcMesh,
    setup: ProcSetup | None = None,
) -> ProcMesh:
    """Spawn the mesh ``name``, or update the running one to ``per_host``.

    Raises:
        SpawnError: a rank did not start (or stop) in time, or the update
            asks for what is not supported (other hosts; resizing a mesh
            that spans several hosts).
    """

    ctl = rt.controller
    entry = _entry(ctl, name)
    async with entry.lock:
        if _live(ctl, name):
            up = await _update(rt, entry, addrs, per_host, name, setup)
        else:
            await _until_over(ctl, name)
            ctl.tombstones.pop(name, None)  # a new mesh under the old name: not stopped
            entry.handles = weakref.WeakSet()
            up = await _procstart.spawn_procs(rt, addrs, per_host, name, name, setup)
            entry.addrs, entry.per = list(addrs), math.prod(per_host.values())
            entry.generation = 0
        entry.handles.add(handle)
        for h in list(entry.handles):  # every handle of the mesh: the new shape
            h._shape, h._refs = up._shape, up._refs
        return up


async def _until_over(ctl: Controller, name: str) -> None:
    """A mesh of that name that is being stopped: wait until it is released."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RELEASE_WAIT
    while name in ctl.views and name not in ctl.creating:
        left = deadline - loop.time()
        if left <= 0:
            raise SpawnError(
                f"mesh {name!r} is still stopping after {RELEASE_WAIT:.0f}s", mesh=name
            )
        await ctl.wait_changed(name, min(left, 1.0))


async def _update(
    rt: Runtime,
    entry: Named,
    addrs: list[str],
    per_host: dict[str, int],
    name: str,
    setup: ProcSetup | None = None,
) -> ProcMesh:
    """Send the changed spec to the mesh's agents; wait until it has its new shape."""

    if list(addrs) != entry.addrs:
        raise SpawnError(
            f"mesh {name!r} runs on {entry.addrs}: an update cannot move it to {list(addrs)} "
            "(stop it first, or spawn under another name)",
            mesh=name,
        )
    per = math.prod(per_host.values())
    if per < 1:
        raise SpawnError(f"per_host sizes must be at least 1, got {per_host}", mesh=name)
    if len(addrs) > 1 and per != entry.per:
        # Flat ranks are laid out host by host: resizing would move ranks between hosts.
        raise SpawnError(
            f"mesh {name!r} spans {len(addrs)} hosts: resizing it in place is not "
            "supported (stop it and spawn it again)",
            mesh=name,
        )
    ctl = rt.controller
    view = ctl.views[name]
    conns: list[tuple[AgentConn, list[int]]] = []
    for h, addr in enumerate(addrs):
        ranks = list(range(h * per, (h + 1) * per))
        for r in ranks:
            st = view.ranks.get(r)
            if st is not None and st.status.terminal:
                # Shrunk away before and now back: the agent starts it afresh,
                # so what ended it before must not freeze the new one.
                del view.ranks[r]
        conns.append((ctl.agent(addr), ranks))
    wanted = {r for _, ranks in conns for r in ranks}
    dropped = sorted(
        r for r, st in view.ranks.items() if r not in wanted and not st.status.terminal
    )
    ctl.creating.add(name)  # a roll stops every rank for a moment: not over
    try:
        for agent, ranks in conns:
            ctl.track(name, agent, ranks)
        for r in dropped:  # calls to them fail at once, not when the agent says so
            ctl.judge(ctl.hosts[(name, r)], name, r, Status.STOPPING, "the mesh shrank")
        dims = {"hosts": len(addrs), **per_host}
        spec = _procstart.proc_spec(dims, setup)
        await asyncio.gather(
            *(
                a.request(
                    functools.partial(
                        w.CreateOrUpdate, name=name, spec=spec(h, r), secret=_local.owner_secret()
                    )
                )
                for h, (a, r) in enumerate(conns)
            )
        )
        # The agents update in place before they answer: their state now is
        # the baseline (events still on the way are older, so ignored).
        for agent, _ in conns:
            reply = await agent.request(functools.partial(w.GetState, name=name))
            for m in reply.meshes:
                entry.generation = max(entry.generation, m.generation)
                for rs in m.ranks:
                    ctl.apply(agent, name, rs)
        await _until_shaped(rt, name, sorted(wanted), dropped)
    except AgentError as exc:
        raise SpawnError(f"update of mesh {name!r} failed: {exc.message}", mesh=name) from exc
    finally:
        ctl.creating.discard(name)
    entry.per = per
    return _procstart.proc_mesh_of(ctl, name, dims, conns)


async def _until_shaped(rt: Runtime, name: str, ranks: list[int], dropped: list[int]) -> None:
    """Wait until every rank of ``ranks`` is Running and every ``dropped`` one is over.

    Raises:
        SpawnError: a rank failed, or the update did not finish in time (the
            mesh is left as it is: the ranks that did start keep running).
    """

    ctl = rt.controller
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _procstart.SPAWN_TIMEOUT
    while True:
        view = ctl.views[name]
        for r in ranks:
            st = view.ranks[r]
            if st.status.failure:
                raise SpawnError(
                    f"proc failed to start in the update: {st.status.value} ({st.reason})",
                    mesh=name, rank=r, host=ctl.hosts[(name, r)].label,
                    log_path=st.log_path or None,
                )  # fmt: skip
        up = all(view.ranks[r].status == Status.RUNNING and view.ranks[r].addr for r in ranks)
        if up and all(view.ranks[r].status.terminal for r in dropped if r in view.ranks):
            return
        left = deadline - loop.time()
        if left <= 0:
            raise SpawnError(
                f"mesh {name!r} did not take its new shape within {_procstart.SPAWN_TIMEOUT:.0f}s",
                mesh=name,
            )
        await ctl.wait_changed(name, min(left, 1.0))

"""A mesh's state as this process knows it, or as its agents say (``mesh.state()``)."""

from __future__ import annotations

import asyncio

from zmesh._client.calls import runtime as _runtime
from zmesh._client.calls.runtime import ProcRef, Runtime
from zmesh._client.control.agents import ask_all
from zmesh._client.control.controller import SupervisionEvent
from zmesh._shared.state import Rank, Status, mesh_status
from zmesh._wire import messages as w


class MeshState:
    """A snapshot of a mesh's ranks, from the client's cached view.

    Attributes:
        name: the proc mesh.
        status: the mesh's status: that of its worst rank.
        ranks: every rank's ``Rank`` (status, generation, reason, pid, log_path).
    """

    def __init__(self, name: str, ranks: dict[int, Rank]) -> None:
        self.name = name
        self.ranks = ranks
        self.status = mesh_status(r.status for r in ranks.values())

    def __repr__(self) -> str:
        return f"<MeshState {self.name} {self.status.value}>"


STATE_TIMEOUT = 2.0  # how long state() waits for agents that must be asked


def _followed_ranks(mesh: str, first: Runtime) -> dict[int, Rank]:
    """What the runtimes of this process know of ``mesh``'s ranks, ``first`` first.

    ``Controller.watch`` fills a view with Running and no pid until the
    agent speaks: that guess is no knowledge, so it is left out.
    """
    others = [rt for rt in _runtime.live_runtimes() if rt is not first]
    known: dict[int, Rank] = {}
    for rt in (first, *others):
        ctl = rt.controller
        # A released mesh's tombstone still says how each rank ended.
        view = ctl.views.get(mesh) or ctl.tombstones.get(mesh)
        if view is None:
            continue
        for r, st in list(view.ranks.items()):
            if r not in known and (st.pid or st.status is not Status.RUNNING):
                known[r] = st
    return known


def _ask_agents(mesh: str, refs: list[ProcRef]) -> dict[int, Rank]:
    """``refs``' ranks as their agents report them now (``GetState``, one per agent).

    A blocking round trip on links of its own (the runtime's sockets belong to
    its loop's thread), to every agent at once, bounded by ``STATE_TIMEOUT`` in all.
    """
    by_agent: dict[str, list[ProcRef]] = {}
    for ref in refs:
        by_agent.setdefault(ref.agent, []).append(ref)
    replies = ask_all(list(by_agent), lambda i: w.GetState(i, mesh), STATE_TIMEOUT)
    out: dict[int, Rank] = {}
    for addr, agent_refs in by_agent.items():
        reply = replies.get(addr)
        if not isinstance(reply, w.StateReply):
            reply = None  # silent, or it refused: nothing it says of the ranks
        states = {}
        if reply is not None:
            for m in reply.meshes:
                if m.name == mesh:
                    states = {rs.rank: rs for rs in m.ranks}
        for ref in agent_refs:
            rs = states.get(ref.rank)
            if reply is None:
                out[ref.rank] = Rank(
                    Status.UNKNOWN, ref.generation, f"agent {addr} did not answer",
                    addr=ref.addr, log_path=ref.log_path,
                )  # fmt: skip
            elif rs is None:
                out[ref.rank] = Rank(
                    Status.FAILED, ref.generation, f"agent {reply.agent} no longer knows it",
                    addr=ref.addr, log_path=ref.log_path,
                )  # fmt: skip
            else:
                out[ref.rank] = Rank(
                    Status(rs.status), rs.generation, rs.reason, rs.pid, rs.addr,
                    rs.log_path, rs.exit_code,
                )  # fmt: skip
    return out


def _event_of(refs: list[ProcRef], rank: int, st: Rank) -> SupervisionEvent:
    host = next((r.host for r in refs if r.rank == rank), "")
    return SupervisionEvent(
        refs[0].mesh, rank, host, st.status, st.reason, st.generation, st.log_path, st.exit_code
    )


class MeshListener:
    """A ``supervision_events()`` iterator's ear, among its proc mesh's listeners.

    A proc's failure names the proc mesh and the proc's rank; an actor's death
    (``zmesh._client.control.actorwatch``) names the actor mesh and the actor's
    rank there, which is not its proc's when a proc hosts several
    (``actors_per_proc``). Each goes to the queue if it is of this mesh's ranks.
    """

    __slots__ = ("actor", "actors", "proc_mesh", "procs", "queue")

    def __init__(
        self, proc_mesh: str, actor: str | None, refs: list[ProcRef],
        queue: asyncio.Queue[SupervisionEvent],
    ) -> None:  # fmt: skip
        self.proc_mesh = proc_mesh
        self.actor = actor  # None: a proc mesh's, which hears of procs only
        self.procs = {ref.rank for ref in refs}
        self.actors = {ref.point if ref.index >= 0 else ref.rank for ref in refs}
        self.queue = queue

    def takes(self, ev: SupervisionEvent) -> bool:
        """Whether ``ev`` is a failure of one of this mesh's (or slice's) ranks."""
        if ev.mesh == self.proc_mesh:
            return ev.rank in self.procs
        return ev.mesh == self.actor and ev.rank in self.actors

    def __call__(self, ev: SupervisionEvent) -> None:
        if self.takes(ev):
            self.queue.put_nowait(ev)

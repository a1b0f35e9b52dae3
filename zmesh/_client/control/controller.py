"""The client side of supervision: agents' streams turned into mesh state.

For every agent a runtime talks to, the controller keeps an ``AgentConn``
(``zmesh._client.control.agentconn``): a control DEALER and a SUB on the agent's
event stream, following the ZeroMQ "Clone" pattern: on the welcome message
(the subscription is live) and whenever it sees a gap in sequence numbers or
a new agent epoch, it re-reads the agent's state with ``GetState`` and
replays the events buffered meanwhile. So no transition is lost, and the
``(mesh, rank, generation)`` dedup makes sure none is reported twice.

An agent whose heartbeats stop is *lost*: its ranks become Unknown and the
calls in flight to them fail. When it is heard again, its state is re-read
and ranks that are still running are usable again. While it is lost, the
client asks it to ``Describe`` itself again and again: an agent restarted
on the same control address answers with a new epoch and a new stream
address, so the client subscribes there, and the ranks of the old
incarnation (whose processes died with it) become Failed.

A mesh that is over (stopped, or every rank in a terminal status) is
*released*: its view, dedup entries and connections go, and a bounded
tombstone remembers how it ended, so a stale handle still fails fast. A
long-lived client spawning and stopping meshes keeps a flat footprint.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import zmq

from zmesh._client.control.agentconn import AgentConn, cancel_task
from zmesh._client.control.agentfates import AgentFates
from zmesh._errors import ActorStoppedError, SupervisionError, ZmeshError
from zmesh._shared.state import FailureDedup, MeshView, Rank, Status
from zmesh._wire import messages as w

if TYPE_CHECKING:
    from zmesh._client.calls.runtime import ProcRef

log = logging.getLogger("zmesh")

# A lost agent's ranks become Unknown after this much silence (bar: <= 2 s).
AGENT_TIMEOUT = float(os.environ.get("ZMESH_AGENT_TIMEOUT", "1.2"))
WATCH_INTERVAL = 0.1
# A control reply this long after the stream's last message: the agent is alive.
ANSWERED_SINCE = 0.5
# An agent that has not answered at all this long after we first needed it
# (the agent of a handle from elsewhere, gone since): its known ranks are Unknown.
NEVER_ANSWERED = AGENT_TIMEOUT + 2.0
# Released meshes remembered (how each rank ended), for calls on stale handles.
# Older ones are forgotten; their agents still know (or say they do not).
TOMBSTONES = 1024
# Set by zmesh._host.proc.procserver: inside a proc, a failure of a mesh the proc spawned that
# no listener or ``__supervise__`` handled fails the proc, so its owner sees it.
ESCALATE_UNHANDLED = False

# What a call to a stopped proc says (Monarch's words after zmesh's).
STOPPED = "rank was stopped: actor mesh is stopped due to proc mesh shutdown"


@dataclass(frozen=True)
class SupervisionEvent:
    """One failure of one rank generation, as delivered to owners.

    Attributes:
        mesh: the proc mesh's name.
        rank: the flat rank.
        host: the agent's label.
        status: ``Failed``, ``Timeout`` or ``Unknown``.
        reason: what happened, e.g. ``killed by SIGKILL``.
        generation: the rank's generation.
        log_path: the proc's log file.
        exit_code: the exit code (negative: a signal), if it exited.
    """

    mesh: str
    rank: int
    host: str
    status: Status
    reason: str
    generation: int
    log_path: str = ""
    exit_code: int | None = None

    def __str__(self) -> str:
        return (
            f"mesh {self.mesh} rank {self.rank} on {self.host}: {self.status.value} "
            f"({self.reason}); log: {self.log_path or 'n/a'}"
        )

    def error(self) -> ZmeshError:
        """The exception calls to this rank fail with."""
        if self.status in (Status.STOPPED, Status.STOPPING):
            return ActorStoppedError(STOPPED, mesh=self.mesh, rank=self.rank, host=self.host)
        return SupervisionError(
            f"rank is {self.status.value}: {self.reason}",
            reason=self.reason, mesh=self.mesh, rank=self.rank,
            host=self.host, log_path=self.log_path or None,
        )  # fmt: skip


class Controller:
    """Mesh state as this runtime knows it, kept current by the agents' streams."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        ctx: zmq.Context[Any],
        break_conn: Callable[[str, ZmeshError | None, str], None],
        release_conns: Callable[[str, ZmeshError], None],
    ) -> None:
        """Follow agents from ``loop``; tell the data path what supervision decides.

        Args:
            loop: the loop every socket and task of the controller lives on.
            ctx: the ZeroMQ context.
            break_conn: ``(addr, error, mesh)``: the rank of ``mesh`` at ``addr``
                broke with ``error`` (its calls fail), or is healthy again (``None``).
            release_conns: ``(mesh, error)``: ``mesh`` is over: close its
                connections, failing what is still on them with ``error``.
        """
        self.loop = loop
        self.ctx = ctx
        self._break_conn = break_conn
        self._release_conns = release_conns
        self.agents: dict[str, AgentConn] = {}
        self.views: dict[str, MeshView] = {}
        self.hosts: dict[tuple[str, int], AgentConn] = {}  # (mesh, rank) -> its agent
        self.dedup = FailureDedup()
        self.changed: dict[str, asyncio.Event] = {}
        self.listeners: dict[str, list[Callable[[SupervisionEvent], None]]] = {}
        self.handlers: dict[str, Callable[[SupervisionEvent], bool]] = {}
        self.owned: set[str] = set()  # meshes spawned (successfully) from here
        self.creating: set[str] = set()  # being spawned: released by the spawn if it fails
        # Released meshes: their final views, oldest first (see release()).
        self.tombstones: OrderedDict[str, MeshView] = OrderedDict()
        self.closed = False
        self._watchdog: asyncio.Task[None] | None = None
        # What a silent, restarted or forgetful agent means for its ranks.
        self.fates = AgentFates(self)

    def agent(self, addr: str) -> AgentConn:
        """The connection to the agent at ``addr``, made on first use."""
        a = self.agents.get(addr)
        if a is None:
            a = self.agents[addr] = AgentConn(self, addr)
            if self._watchdog is None:
                self._watchdog = self.loop.create_task(self._watch_agents())
        return a

    def watch(self, ref: ProcRef) -> None:
        """Follow the supervision of ``ref``'s rank (a handle we call)."""
        if ref.mesh in self.tombstones or not ref.agent:
            return  # over, or a client's own proc (this_proc()): no agent to follow
        a = self.agent(ref.agent)
        view = self.views.get(ref.mesh)
        if view is None:
            view = self.views[ref.mesh] = MeshView(ref.mesh, [])
            if a.ready.is_set():
                # A handle from elsewhere (or one whose tombstone was
                # forgotten): ask the agent how the mesh is, so a mesh that
                # is gone fails its calls instead of leaving them waiting.
                a._resync()
        if ref.rank not in view.ranks:
            view.ranks[ref.rank] = Rank(Status.RUNNING, ref.generation, addr=ref.addr)
        self.hosts[(ref.mesh, ref.rank)] = a

    def track(self, mesh: str, agent: AgentConn, ranks: list[int]) -> None:
        """Start following a mesh we are creating on ``agent``."""
        view = self.views.setdefault(mesh, MeshView(mesh, []))
        for r in ranks:
            view.ranks.setdefault(r, Rank())
            self.hosts[(mesh, r)] = agent

    # ------------------------------------------------------------ applying

    def apply(self, agent: AgentConn, mesh: str, rs: w.RankState) -> None:
        view = self.views.get(mesh)
        if view is None:
            return  # not a mesh of ours
        new = Rank(
            Status(rs.status), rs.generation, rs.reason, rs.pid, rs.addr, rs.log_path, rs.exit_code
        )
        state = view.apply(rs.rank, new)
        if state is None:
            return
        self._consequences(agent, mesh, rs.rank, state)

    def _consequences(self, agent: AgentConn, mesh: str, rank: int, state: Rank) -> None:
        event = SupervisionEvent(
            mesh, rank, agent.label, state.status, state.reason,
            state.generation, state.log_path, state.exit_code,
        )  # fmt: skip
        if state.addr:
            healthy = state.status in (Status.RUNNING, Status.INITIALIZING)
            self._break_conn(state.addr, None if healthy else event.error(), mesh)
        ev = self.changed.pop(mesh, None)
        if ev is not None:
            ev.set()
        if state.status.failure and self.dedup.first(mesh, rank, state.generation):
            self._report(event)
        if state.status.terminal:
            self.release_if_over(mesh)

    def _report(self, event: SupervisionEvent) -> None:
        handled = False
        for listener in self.listeners.get(event.mesh, []):
            listener(event)
            handled = handled or takes(listener, event)
        handler = self.handlers.get(event.mesh)
        if handler is not None:
            handled = handler(event) or handled
        if not handled:
            log.error("unhandled supervision event: %s", event)
            if ESCALATE_UNHANDLED and event.mesh in self.owned:
                log.error("failing this proc so that its owner is told")
                os._exit(1)

    async def _watch_agents(self) -> None:
        while not self.closed:
            await asyncio.sleep(WATCH_INTERVAL)
            now = time.monotonic()
            for a in list(self.agents.values()):
                if a.sub is None and now - a.last_heard > NEVER_ANSWERED:
                    # Never heard (last_heard: when we first asked): the ranks we
                    # know of there, from handles, cannot be followed (each judged
                    # once, a later handle's too). Its first message, if it ever
                    # answers, makes it reachable again.
                    a.lost = True
                    self.fates.agent_lost(a)
                    continue
                if not a.lost and a.sub is not None and now - a.last_heard > AGENT_TIMEOUT:
                    # Our own loop may have been the slow one: read what the
                    # agent sent meanwhile before calling it lost.
                    a.sub.drain()
                    silent = time.monotonic() - a.last_heard
                    if silent > AGENT_TIMEOUT and not a.lost:
                        # Even with no ranks there: it may come back as a new
                        # incarnation, whose stream we must follow for later spawns.
                        a.lost = True
                        # An answer on its control socket well after its stream went
                        # quiet (a dying agent cannot give one): most likely it
                        # restarted, which Describe tells before anything is judged.
                        if a.last_reply < a.last_heard + ANSWERED_SINCE:
                            self.fates.agent_lost(a)
                        a.rejoin()

    def judge(self, agent: AgentConn, mesh: str, rank: int, status: Status, reason: str) -> None:
        """Set a rank's status from what this client knows (a stop it asked
        for, a lost agent), in the rank's current generation, with the same
        consequences as a report from the agent."""
        view = self.views.get(mesh)
        cur = view.ranks.get(rank) if view is not None else None
        if view is None or cur is None or cur.status.terminal:
            return
        state = view.apply(rank, replace(cur, status=status, reason=reason))
        if state is not None:
            self._consequences(agent, mesh, rank, state)

    # ------------------------------------------------------------ releasing

    def release(self, mesh: str) -> None:
        """Forget a mesh that is over; close its connections; keep a tombstone.

        Calls still on its connections fail (supervision failed them already
        when its ranks stopped or broke). Later calls on a handle of it fail
        at once with what the tombstone says (``ActorStoppedError`` or
        ``SupervisionError``), with no socket made.
        """
        view = self.views.pop(mesh, None)
        if view is None:
            return
        for rank in view.ranks:
            self.hosts.pop((mesh, rank), None)
        self.dedup.forget(mesh)
        ev = self.changed.pop(mesh, None)
        if ev is not None:
            ev.set()
        self.listeners.pop(mesh, None)
        self.handlers.pop(mesh, None)
        self.owned.discard(mesh)
        self.creating.discard(mesh)
        self.tombstones[mesh] = view
        while len(self.tombstones) > TOMBSTONES:
            self.tombstones.popitem(last=False)
        self._release_conns(mesh, ActorStoppedError(f"mesh {mesh} was stopped", mesh=mesh))

    def release_if_over(self, mesh: str) -> None:
        """Release ``mesh`` if every rank is in a terminal status (and it is
        not being spawned: a failed spawn releases it itself)."""
        view = self.views.get(mesh)
        if (
            view is not None
            and mesh not in self.creating
            and all(r.status.terminal for r in view.ranks.values())
        ):
            self.release(mesh)  # every rank is over: nothing can call it again

    def gone(self, ref: ProcRef) -> ZmeshError | None:
        """The error for a call to ``ref`` if its mesh was released, else ``None``.

        Also when the mesh lives on but ``ref``'s proc does not: its rank is
        over (the mesh shrank in place) or in a newer generation (rolled, or
        the name spawned again), so the proc ``ref`` points at has exited.
        """
        ctx: dict[str, Any] = {
            "mesh": ref.mesh, "rank": ref.rank, "host": ref.host, "log_path": ref.log_path or None,
        }  # fmt: skip
        view = self.tombstones.get(ref.mesh)
        if view is None:
            live = self.views.get(ref.mesh)
            now = live.ranks.get(ref.rank) if live is not None else None
            if now is None or now.generation < ref.generation:
                return None
            if now.generation > ref.generation:
                return ActorStoppedError(
                    f"rank was stopped: it runs in generation {now.generation} now, "
                    "spawn on the mesh again to reach it",
                    **ctx,
                )
            if not now.status.terminal or live is None:
                return None
            view = live
        st = view.ranks.get(ref.rank)
        if st is not None and st.status.failure:
            return SupervisionError(
                f"rank is {st.status.value}: {st.reason}", reason=st.reason, **ctx
            )
        return ActorStoppedError(STOPPED, **ctx)

    def live_at(self, ref: ProcRef) -> bool:
        """Whether this runtime knows ``ref``'s rank as healthy at ``ref.addr``."""
        view = self.views.get(ref.mesh)
        st = view.ranks.get(ref.rank) if view is not None else None
        return (
            st is not None
            and st.addr == ref.addr
            and st.status in (Status.RUNNING, Status.INITIALIZING)
        )

    # ------------------------------------------------------------ waiting

    async def wait_changed(self, mesh: str, timeout: float) -> None:
        ev = self.changed.get(mesh)
        if ev is None:
            ev = self.changed[mesh] = asyncio.Event()
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def close(self) -> None:
        self.closed = True
        if self._watchdog is not None:
            cancel_task(self._watchdog)
        for a in self.agents.values():
            a.close()
        self.agents.clear()


def takes(listener: Any, event: SupervisionEvent) -> bool:
    """Whether ``listener`` (of ``supervision_events()``) takes ``event``:
    one with no ``takes`` takes every event of its mesh."""
    accepts = getattr(listener, "takes", None)
    return accepts is None or bool(accepts(event))

"""Collecting: follow every agent's streams and keep what the dashboard shows.

The collector talks to agents directly (no broker): for each address it asks
``Describe`` for the event stream and subscribes, then asks ``GetStats``,
whose answer gives data at once and the address of the agent's stats stream.
From then on each agent publishes a ``Stats`` message about once a second on
the stats stream (host, meshes, procs' counters) and an ``Event`` for every
rank transition on the event stream. ``snapshot()`` turns what was heard into
a frozen ``Snapshot``: the latest sample of each agent, an older one a window
ago (rates and percentiles are differences of the two), and the event log.

The agents of this user on this machine are known from the registry (their
pids): one whose process has ended is taken off with an ``exited`` event (its
script ended, or it was stopped), not reported ``lost`` as if the network had
cut it off. With ``follow=True`` (no agents named) the registry is read again
every ``FOLLOW_EVERY`` seconds, so agents started later (a new script's
embedded agent) appear.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from typing import Any

import msgspec
import zmq

from zmesh._client.control.agents import AgentClient
from zmesh._errors import AgentError, SecurityError
from zmesh._shared import registry
from zmesh._shared.state import Status
from zmesh._shared.stats import ProcStatistics
from zmesh._wire import messages as w
from zmesh._wire import security as _security
from zmesh._wire.codec import Codec
from zmesh._wire.security import keys_for, secure_client
from zmesh._wire.zsock import AsyncSocket, configure

LOST_AFTER = 1.0  # seconds without a word from an agent (it heartbeats every 0.1 s)
FOLLOW_EVERY = 1.0  # seconds between reads of the registry (new agents, ended ones)
HISTORY = 180  # samples kept per agent (3 minutes at one a second)
EVENTS = 500  # events kept


class EventRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """One line of the event log.

    ``kind`` is a rank status (``Initializing``, ``Running``, ``Failed``, ...)
    for a rank transition, ``lost`` / ``back`` for an agent's heartbeats, or
    ``exited`` / ``joined`` for a local agent that ended or started (the
    registry says).
    """

    time: float
    agent: str
    kind: str
    mesh: str = ""
    rank: int = -1
    generation: int = 0
    reason: str = ""
    exit_code: int | None = None


class AgentSample(msgspec.Struct, frozen=True, omit_defaults=True):
    """What is known of one agent.

    Attributes:
        address: its control address, as given.
        state: ``connecting`` (never heard), ``ok`` or ``lost`` (silent).
        heard: wall clock when anything last came from it (0: never).
        received: wall clock when ``stats`` arrived (0: never).
        stats: its latest ``Stats``; base: the one a window before it.
        gone: the last statistics of procs that have ended since we watch.
        stopped: the meshes it stopped on request (``GetHealth``).
        ended: mesh -> wall clock when we first saw none of its ranks live
            (how old history is).
    """

    address: str
    label: str
    state: str
    heard: float = 0.0
    received: float = 0.0
    stats: w.Stats | None = None
    base: w.Stats | None = None
    gone: list[ProcStatistics] = []
    stopped: list[str] = []
    ended: dict[str, float] = {}


class Snapshot(msgspec.Struct, frozen=True):
    """Everything the dashboard draws, taken at ``time`` (the collector's wall clock)."""

    time: float
    window: float
    agents: list[AgentSample]
    events: list[EventRecord] = []


class _Agent:
    """One agent followed: a control DEALER and a SUB on its stream."""

    def __init__(self, col: Collector, address: str, entry: registry.Entry | None) -> None:
        self.col = col
        self.address = address
        self.entry = entry  # its registry entry (a local agent of ours), else None
        self.label = address
        self.epoch = ""
        self.state = "connecting"
        self.heard = 0.0
        self.received = 0.0
        self.history: deque[w.Stats] = deque(maxlen=HISTORY)
        self.gone: dict[tuple[str, int, int], ProcStatistics] = {}
        self.stopped: list[str] = []
        self.health_at = 0.0  # when GetHealth was last answered (or given up on)
        self.health_asked = 0.0
        self.ended: dict[str, float] = {}
        self.stream_codec = Codec(w.OBSERVER_STREAM, allow_pickle=False)
        self.keys = keys_for(address)  # its own, when the registry says which
        self.client = AgentClient(col.ctx, address, col.loop, allow_pickle=False, keys=self.keys)
        self.sub: AsyncSocket | None = None
        self.stats_sub: AsyncSocket | None = None
        self.task = col.loop.create_task(self._start())

    async def _start(self) -> None:
        while True:
            try:
                info = await self.request(w.Describe, 1.0)
                break
            except AgentError:
                continue  # not up yet: keep asking
        self.label = self.client.label = info.label
        self.epoch = info.epoch
        sub = secure_client(
            configure(self.col.ctx.socket(zmq.SUB), addr=info.stream), self.keys, info.stream
        )
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(info.stream)
        self.sub = AsyncSocket(sub, self.col.loop, self._on_stream)
        await self.refresh()

    async def refresh(self) -> None:
        """Ask for the agent's statistics now (at start, and when it is back)."""
        with contextlib.suppress(AgentError):
            reply = await self.request(w.GetStats, 2.0)
            if self.stats_sub is None and reply.stream:
                sock = configure(self.col.ctx.socket(zmq.SUB), addr=reply.stream)
                sub = secure_client(sock, self.keys, reply.stream)
                sub.setsockopt(zmq.SUBSCRIBE, b"")
                sub.connect(reply.stream)
                self.stats_sub = AsyncSocket(sub, self.col.loop, self._on_stream)
            self._on_stats(reply.stats)
        await self.ask_health()

    async def ask_health(self) -> None:
        """Ask which meshes were stopped on request (at most about once a second)."""
        now = time.monotonic()
        if now - self.health_asked < 1.0:
            return
        self.health_asked = now
        try:
            reply = await self.request(w.GetHealth, 2.0)
            self.stopped = list(reply.stopped)
        except AgentError:
            pass  # an agent that does not know GetHealth: judged from its ranks alone
        self.health_at = time.monotonic()

    async def request(self, make: Any, timeout: float) -> Any:
        """The agent's reply to ``make(id)`` (an ``Ack`` that says no is returned).

        Raises:
            AgentTimeoutError: no reply within ``timeout`` (a ``TimeoutError``).
        """
        return await self.client.request(make, timeout, check=False)

    def _on_stream(self, frames: list[Any]) -> None:
        try:
            msg = self.stream_codec.decode(frames)
        except Exception:  # a message of a newer agent: not for us
            return
        self._heard()
        if isinstance(msg, w.Stats):
            self._on_stats(msg)
        elif isinstance(msg, w.Event):
            s = msg.state
            self.col.add_event(
                EventRecord(
                    msg.time,
                    msg.agent,
                    s.status,
                    msg.mesh,
                    s.rank,
                    s.generation,
                    s.reason,
                    s.exit_code,
                )
            )

    def _heard(self) -> None:
        self.heard = time.time()
        if self.state == "lost":
            self.col.add_event(EventRecord(self.heard, self.label, "back"))
            self.col.loop.create_task(self.refresh())
        self.state = "ok"

    def _on_stats(self, st: w.Stats) -> None:
        if self.history and st.time <= self.history[-1].time:
            return  # a reply that crossed a newer published sample
        self._heard()
        self.label = st.agent
        if self.history:
            now = {(p.mesh, p.rank, p.generation) for p in st.procs}
            for p in self.history[-1].procs:
                key = (p.mesh, p.rank, p.generation)
                if key not in now:
                    self.gone[key] = p
            while len(self.gone) > 256:
                del self.gone[next(iter(self.gone))]
        self.history.append(st)
        self.received = time.time()
        names = set()
        for m in st.meshes:
            names.add(m.name)
            if any(r.status in (Status.RUNNING, Status.INITIALIZING) for r in m.ranks):
                self.ended.pop(m.name, None)
            else:
                self.ended.setdefault(m.name, self.received)
        for name in [n for n in self.ended if n not in names]:
            del self.ended[name]  # the agent forgot it
        if self.sub is not None and time.monotonic() - self.health_asked >= 1.0:
            self.col.spawn(self.ask_health())

    def spans(self) -> bool:
        """Whether the first and latest samples differ for every proc in the latest."""
        if len(self.history) < 2:
            return False
        first = {(p.mesh, p.rank, p.generation): p.time for p in self.history[0].procs}
        return all(
            first.get((p.mesh, p.rank, p.generation)) != p.time for p in self.history[-1].procs
        )

    def process_ended(self) -> bool:
        """Whether this is a local agent whose process is gone (not a lost network)."""
        return self.entry is not None and not registry.running(self.entry)

    def check(self, now: float) -> None:
        if self.state == "ok" and now - self.heard > LOST_AFTER:
            if self.process_ended():
                self.col.retire(self, now)
                return
            self.state = "lost"
            self.col.add_event(
                EventRecord(now, self.label, "lost", reason=f"silent for {now - self.heard:.1f}s")
            )

    def sample(self, window: float) -> AgentSample:
        latest = self.history[-1] if self.history else None
        base = None
        if latest is not None:
            for st in self.history:  # oldest first: keep the newest old enough
                if st.time <= latest.time - window:
                    base = st
            if base is None and len(self.history) > 1:
                base = self.history[0]
        return AgentSample(
            self.address,
            self.label,
            self.state,
            self.heard,
            self.received,
            latest,
            base,
            list(self.gone.values()),
            list(self.stopped),
            dict(self.ended),
        )

    def close(self) -> None:
        if not self.task.done():
            self.task.cancel()
        self.client.close()
        for sub in (self.sub, self.stats_sub):
            if sub is not None:
                sub.close()


class Collector:
    """Follow a set of agents from the running event loop.

    Args:
        addresses: the agents' control addresses (``tcp://host:port``).
        window: the default sliding window for rates, in seconds.
        follow: also follow the agents this user starts on this machine
            later (the registry), as ``zmesh top`` with no agents named does.
    """

    def __init__(self, addresses: list[str], window: float = 10.0, follow: bool = False) -> None:
        self.loop = asyncio.get_running_loop()
        self.ctx: zmq.Context[Any] = zmq.Context.instance()
        self.ids = itertools.count(1)
        self.window = window
        self.follow = follow
        self.events: deque[EventRecord] = deque(maxlen=EVENTS)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.entries = {e.address: e for e in registry.live()}  # this user's local agents
        self.agents = [_Agent(self, a, self.entries.get(a)) for a in dict.fromkeys(addresses)]
        self._watch = self.loop.create_task(self._watch_forever())

    def add_event(self, ev: EventRecord) -> None:
        self.events.append(ev)

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` on the loop until it ends or the collector closes."""
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def request(self, address: str, make: Any, timeout: float) -> Any:
        """Send ``make(id)`` to the agent at ``address``; its reply.

        Raises:
            AgentTimeoutError: no reply within ``timeout`` seconds (an
                ``asyncio.TimeoutError`` too).
            LookupError: not an agent this collector follows.
        """
        agent = next((a for a in self.agents if a.address == address), None)
        if agent is None:
            raise LookupError(f"not following an agent at {address!r}")
        return await agent.request(make, timeout)

    def retire(self, agent: _Agent, now: float) -> None:
        """Stop following ``agent``, whose process has ended; say so in the event log."""
        if agent not in self.agents:
            return
        self.agents.remove(agent)
        agent.close()
        pid = agent.entry.pid if agent.entry is not None else 0
        self.add_event(EventRecord(now, agent.label, "exited", reason=f"agent pid {pid} ended"))

    def _follow_registry(self, now: float) -> None:
        """Read the registry: agents that ended go, new ones (``follow``) are followed."""

        self.entries = {e.address: e for e in registry.live()}
        for a in list(self.agents):
            if a.entry is None:
                a.entry = self.entries.get(a.address)
            if a.process_ended():
                self.retire(a, now)
        if not self.follow:
            return
        known = {a.address for a in self.agents}
        for address, entry in self.entries.items():
            if address in known:
                continue
            if entry.keys:  # reached with its own keys, as the commands do
                with contextlib.suppress(SecurityError):
                    _security.use_for(address, entry.keys)
            self.agents.append(_Agent(self, address, entry))
            self.add_event(EventRecord(now, entry.label, "joined", reason=f"agent pid {entry.pid}"))

    async def _watch_forever(self) -> None:
        followed = time.monotonic()
        while True:
            await asyncio.sleep(0.2)
            now = time.time()
            for a in list(self.agents):
                a.check(now)
            if time.monotonic() - followed >= FOLLOW_EVERY:
                followed = time.monotonic()
                self._follow_registry(now)

    def snapshot(self, window: float | None = None) -> Snapshot:
        """What is known now, with rates over ``window`` seconds (default: ``self.window``)."""
        win = self.window if window is None else window
        return Snapshot(time.time(), win, [a.sample(win) for a in self.agents], list(self.events))

    async def wait(self, samples: int, timeout: float) -> bool:
        """Wait until every agent has given ``samples`` statistics; False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # The stopped meshes too: without them, status cannot tell a
            # mesh its owner stopped from one that died.
            if all(len(a.history) >= samples and a.health_at for a in self.agents):
                # With two samples or more, each proc must have reported in
                # between, or its rates would be over no time at all.
                if samples < 2 or all(a.spans() for a in self.agents):
                    return True
            await asyncio.sleep(0.05)
        return False

    def close(self) -> None:
        self._watch.cancel()
        for task in list(self._tasks):
            task.cancel()
        for a in self.agents:
            a.close()

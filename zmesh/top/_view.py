"""Deriving the view: pure functions from a ``Snapshot`` to the rows drawn.

Nothing here reads a clock or a socket: the time is the snapshot's, so the
same snapshot always gives the same view (that is what the tests rely on).
Rates and percentiles are over the snapshot's window: the difference
between each agent's latest sample and its sample a window before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from zmesh._service.client import decode_table
from zmesh._shared.stats import ServiceSummary
from zmesh.top._collect import AgentSample, EventRecord, Snapshot
from zmesh.top._endpoints import EndpointRow, endpoint_rows, total_row
from zmesh.top._health import FAILURES, LIVE, judge

STALE_INTERVALS = 3  # data older than this many intervals is STALE
KEEP = 300.0  # seconds that history rows and the failed counter cover, by default
PANES = ("hosts", "procs", "actors", "services", "events")


@dataclass(frozen=True)
class HostRow:
    label: str
    address: str
    state: str  # ok, STALE, lost, connecting
    procs: int = 0
    cpu: float | None = None
    mem_used: int = 0
    mem_total: int = 0
    load: float | None = None
    age: float | None = None  # seconds since its latest statistics

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.label, self.address)


@dataclass(frozen=True)
class ProcRow:
    host: str
    mesh: str
    rank: int
    pid: int
    state: str
    generation: int = 1
    cpu: float | None = None
    rss: int | None = None
    uptime: float | None = None
    reason: str = ""
    history: bool = False  # a dead generation or a stopped mesh (folded by default)
    log: str = ""  # its log file, on its host
    address: str = ""  # its agent's control address

    @property
    def restarts(self) -> int:
        return max(0, self.generation - 1)

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.mesh, self.rank, self.host)


@dataclass(frozen=True)
class ReplicaRow:
    """One replica of a service: the orchestrator's table joined with its procs' numbers.

    ``in_flight``, ``queue``, ``calls``, ``p50`` and ``mean_batch`` are over
    the replica's current mesh and the service's actor, as the actors pane
    counts them (``None`` / 0 until its procs report).
    """

    index: int
    state: str
    generation: int
    restarts: int = 0
    last_failure: str = ""
    mesh: str = ""
    host: str = ""
    in_flight: int = 0
    queue: int = 0
    calls: float = 0.0
    p50: float | None = None
    mean_batch: float | None = None


@dataclass(frozen=True)
class ServiceRow:
    name: str
    healthy: int
    desired: int
    restarts: int
    last_failure: str
    state: str
    id: str = ""  # names may repeat (two scripts' "embedder"); ids do not
    replicas: tuple[ReplicaRow, ...] = ()
    warning: str = ""  # e.g. requests that wait for an endpoint that runs one at a time

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.name, self.id)


@dataclass(frozen=True)
class Header:
    agents_ok: int
    agents_total: int
    procs_running: int
    procs_total: int
    actors_alive: int
    failed: int  # ranks that failed within the last ``keep`` seconds
    services_ok: int
    services_degraded: int
    calls: float
    errors: float
    age: float | None  # of the oldest agent's data
    stale: bool
    window: float
    time: float
    history: int = 0  # proc rows of dead generations and stopped meshes (folded or not)
    keep: float = KEEP


@dataclass(frozen=True)
class Options:
    """What the user chose: filter, errors-only, sort column per pane, and history.

    ``show_history`` unfolds the rows of dead generations and stopped meshes;
    ``keep`` is how long (seconds) history rows stay, and the span of the
    header's failed counter.
    """

    filter: str = ""
    errors_only: bool = False
    sort: dict[str, int] = field(default_factory=dict)  # pane -> column index
    show_history: bool = False
    keep: float = KEEP


@dataclass(frozen=True)
class View:
    header: Header
    hosts: list[HostRow]
    procs: list[ProcRow]
    endpoints: list[EndpointRow]  # the Total row first
    services: list[ServiceRow]
    events: list[EventRecord]


# Sortable columns per pane: (title, key, descending). Column 0 is the name.
def _num(v: float | int | None) -> float:
    return float("-inf") if v is None else float(v)


SORTS: dict[str, list[tuple[str, Callable[[Any], Any], bool]]] = {
    "hosts": [
        ("host", lambda r: r.label, False),
        ("procs", lambda r: r.procs, True),
        ("cpu", lambda r: _num(r.cpu), True),
        ("mem", lambda r: r.mem_used, True),
    ],
    "procs": [
        ("mesh", lambda r: (r.mesh, r.rank), False),
        ("host", lambda r: r.host, False),
        ("state", lambda r: r.state, False),
        ("cpu", lambda r: _num(r.cpu), True),
        ("rss", lambda r: _num(r.rss), True),
        ("rst", lambda r: r.restarts, True),
    ],
    "actors": [
        ("name", lambda r: r.key, False),
        ("calls/s", lambda r: r.calls, True),
        ("p50", lambda r: _num(r.p50), True),
        ("p99", lambda r: _num(r.p99), True),
        ("err/s", lambda r: r.errors, True),
        ("inflight", lambda r: r.in_flight, True),
        ("queue", lambda r: r.queue, True),
        ("batches", lambda r: r.batches_total, True),
        ("batch", lambda r: _num(r.mean_batch), True),
    ],
    "services": [
        ("name", lambda r: r.name, False),
        ("rst", lambda r: r.restarts, True),
    ],
    "events": [("time", lambda r: r.time, False)],
}


def sort_rows(rows: Sequence[Any], pane: str, column: int) -> list[Any]:
    """Sort by ``column`` of ``pane``; ties keep name order, so rows never jump."""
    cols = SORTS[pane]
    _, key, desc = cols[column % len(cols)]
    by_name = sorted(rows, key=lambda r: r.key)
    return sorted(by_name, key=key, reverse=desc) if column % len(cols) else by_name


def _matches(text: str, *fields: Any) -> bool:
    if not text:
        return True
    t = text.lower()
    return any(t in str(f).lower() for f in fields)


# ------------------------------------------------------------------ derive


def derive(snap: Snapshot, opts: Options | None = None) -> View:
    """The rows and header for ``snap``, filtered and sorted as ``opts`` says."""
    opts = opts or Options()
    hosts = [_host_row(a, snap.time) for a in snap.agents]
    health = judge(snap)
    procs = [
        row for a in snap.agents for row in _proc_rows(a, health.history, snap.time - opts.keep)
    ]
    endpoints = endpoint_rows(snap.agents)
    # A service reports to every agent it has replicas on: one row per service.
    by_id = {
        s.id or s.name: s for a in snap.agents if a.stats is not None for s in a.stats.services
    }
    services = [service_row(s, endpoints) for s in by_id.values()]
    header = _header(snap, hosts, procs, endpoints, services, opts.keep)
    if not opts.show_history:
        procs = [p for p in procs if not p.history]
    f = opts.filter
    hosts = [h for h in hosts if _matches(f, h.label, h.address, h.state)]
    procs = [p for p in procs if _matches(f, p.mesh, p.host, p.state, p.pid, p.reason)]
    endpoints = [e for e in endpoints if _matches(f, e.mesh, e.actor, e.endpoint)]
    services = [s for s in services if _matches(f, s.name, s.state)]
    events = [e for e in snap.events if _matches(f, e.agent, e.kind, e.mesh, e.reason)]
    if opts.errors_only:
        hosts = [h for h in hosts if h.state != "ok"]
        procs = [p for p in procs if p.state in FAILURES and not p.history]
        endpoints = [e for e in endpoints if e.errors > 0]
        services = [s for s in services if s.healthy < s.desired]
        events = [e for e in events if e.kind in FAILURES or e.kind == "lost"]
    total = total_row(endpoints)
    return View(
        header=header,
        hosts=sort_rows(hosts, "hosts", opts.sort.get("hosts", 0)),
        procs=sort_rows(procs, "procs", opts.sort.get("procs", 0)),
        endpoints=[total, *sort_rows(endpoints, "actors", opts.sort.get("actors", 0))],
        services=sort_rows(services, "services", opts.sort.get("services", 0)),
        events=sorted(events, key=lambda e: e.time),
    )


def service_row(s: ServiceSummary, endpoints: Sequence[EndpointRow]) -> ServiceRow:
    """A service's row: its summary, a row per replica, and a warning if one is due."""
    by_mesh: dict[tuple[str, str], list[EndpointRow]] = {}
    for e in endpoints:
        by_mesh.setdefault((e.mesh, e.actor), []).append(e)
    replicas = []
    for r in decode_table(s.table) if s.table else []:
        mesh = r.refs[0].mesh if r.refs else ""
        mine = by_mesh.get((mesh, r.actor), [])
        t = total_row(mine)
        batched = sum(e.mean_batch * e.calls for e in mine if e.mean_batch)
        runs = sum(e.calls / e.mean_batch for e in mine if e.mean_batch)
        replicas.append(
            ReplicaRow(
                r.index,
                r.state,
                r.generation,
                r.restarts,
                r.last_failure,
                mesh,
                r.refs[0].host if r.refs else "",
                t.in_flight,
                t.queue,
                t.calls,
                t.p50,
                batched / runs if runs else None,
            )
        )
    return ServiceRow(
        s.name, s.healthy, s.desired, s.restarts, s.last_failure, s.state, s.id,
        tuple(sorted(replicas, key=lambda r: r.index)), _serial_warning(s, endpoints, replicas),
    )  # fmt: skip


def _serial_warning(
    s: ServiceSummary, endpoints: Sequence[EndpointRow], replicas: Sequence[ReplicaRow]
) -> str:
    """Why a service allowing several requests per replica runs them one at a time.

    Only endpoints that were called count: one nobody calls costs nothing.
    """
    if s.max_concurrent <= 1 or not s.serial:
        return ""
    meshes = {r.mesh for r in replicas}
    used = sorted(
        {e.endpoint for e in endpoints if e.mesh in meshes and e.calls_total + e.in_flight}
        & set(s.serial)
    )
    if not used:
        return ""
    names = ", ".join(used)
    verb = "is" if len(used) == 1 else "are"
    return f"{names} {verb} not concurrent: 1 request at a time per replica, not {s.max_concurrent}"


def _age(a: AgentSample, now: float) -> float | None:
    return max(0.0, now - a.received) if a.received else None


def _is_stale(a: AgentSample, now: float) -> bool:
    age = _age(a, now)
    interval = a.stats.interval if a.stats is not None else 1.0
    return a.state == "lost" or (age is not None and age > STALE_INTERVALS * interval)


def _host_row(a: AgentSample, now: float) -> HostRow:
    st = a.stats
    if st is None:
        return HostRow(a.label, a.address, a.state if a.state != "ok" else "connecting")
    state = "lost" if a.state == "lost" else "STALE" if _is_stale(a, now) else "ok"
    h = st.host
    running = sum(1 for m in st.meshes for r in m.ranks if r.status in LIVE)
    return HostRow(
        st.agent,
        a.address,
        state,
        running,
        h.cpu_percent,
        h.mem_used,
        h.mem_total,
        h.load[0] if h.load else None,
        _age(a, now),
    )


def _proc_rows(a: AgentSample, history: set[tuple[str, str]], since: float) -> list[ProcRow]:
    """The rows of ``a``'s procs; those of history meshes that ended before ``since`` are gone."""
    st = a.stats
    if st is None:
        return []
    live = {(p.mesh, p.rank): p for p in st.procs}
    rows = []
    for m in st.meshes:
        past = (st.agent, m.name) in history
        if past and a.ended.get(m.name, since) < since:
            continue  # aged out
        for r in m.ranks:
            p = live.get((m.name, r.rank))
            if p is not None and p.generation != r.generation:
                p = None
            status = "Unknown" if a.state == "lost" and r.status == "Running" else r.status
            if status == "Running" and p is not None and p.initializing:
                status = "Initializing"  # up, but an actor's __init__ still runs
            reason = r.reason
            if r.exit_code is not None and "code" not in reason and "killed" not in reason:
                reason = f"{reason} (code={r.exit_code})" if reason else f"code={r.exit_code}"
            rows.append(
                ProcRow(
                    st.agent,
                    m.name,
                    r.rank,
                    r.pid,
                    status,
                    r.generation,
                    p.cpu_percent if p else None,
                    p.rss if p else None,
                    p.uptime if p else None,
                    reason,
                    past,
                    log=r.log_path,
                    address=a.address,
                )
            )
    return rows


def _header(
    snap: Snapshot,
    hosts: Sequence[HostRow],
    procs: Sequence[ProcRow],
    endpoints: Sequence[EndpointRow],
    services: Sequence[ServiceRow],
    keep: float,
) -> Header:
    alive = 0
    since = snap.time - keep
    # Failures we saw happen within the last ``keep`` seconds: from the event
    # stream, and from procs whose last report came before they failed.
    failed = {
        (e.agent, e.mesh, e.rank, e.generation)
        for e in snap.events
        if e.kind in FAILURES and e.mesh and e.time >= since
    }
    for a in snap.agents:
        if a.stats is None:
            continue
        status = {(m.name, r.rank, r.generation): r.status for m in a.stats.meshes for r in m.ranks}
        for p in a.stats.procs:
            if status.get((p.mesh, p.rank, p.generation)) == "Running":
                alive += len(p.actors)
        for p in a.gone:
            if status.get((p.mesh, p.rank, p.generation)) in FAILURES and p.time >= since:
                failed.add((a.stats.agent, p.mesh, p.rank, p.generation))
    ages = [h.age for h in hosts if h.age is not None]
    return Header(
        agents_ok=sum(1 for h in hosts if h.state == "ok"),
        agents_total=len(hosts),
        procs_running=sum(1 for p in procs if p.state == "Running"),
        procs_total=sum(1 for p in procs if not p.history),
        actors_alive=alive,
        failed=len(failed),
        services_ok=sum(1 for s in services if s.healthy >= s.desired),
        services_degraded=sum(1 for s in services if s.healthy < s.desired),
        calls=sum(e.calls for e in endpoints),
        errors=sum(e.errors for e in endpoints),
        age=max(ages) if ages else None,
        stale=any(_is_stale(a, snap.time) for a in snap.agents if a.stats is not None),
        window=snap.window,
        time=snap.time,
        history=sum(1 for p in procs if p.history),
        keep=keep,
    )


def describe_event(e: EventRecord) -> str:
    """The words of one event-log line."""
    where = f"{e.mesh}[{e.rank}]" if e.mesh else ""
    if e.kind == "lost":
        return f"{e.agent}: heartbeat lost ({e.reason}); partition or host down"
    if e.kind == "back":
        return f"{e.agent}: reachable again"
    if e.kind == "exited":  # its process ended (script done, or stopped): no partition
        return f"{e.agent}: agent exited ({e.reason})"
    if e.kind == "joined":
        return f"{e.agent}: agent started ({e.reason})"
    if e.kind == "Initializing":
        verb = "restarted" if e.generation > 1 else "spawned"
        return f"{where} {verb} on {e.agent} (gen {e.generation})"
    if e.kind == "Running":
        return f"{where} running on {e.agent}"
    code = f" code={e.exit_code}" if e.exit_code is not None else ""
    if e.kind in ("Failed", "Stopped"):
        verb = "exited" if e.kind == "Failed" else "stopped"
        return f"{where} {verb}{code} on {e.agent}: {e.reason}".rstrip(": ")
    return f"{where} {e.kind} on {e.agent}: {e.reason}".rstrip(": ")


# ------------------------------------------------------------ status / ps


def unhealthy(snap: Snapshot) -> list[str]:
    """Why the mesh is not healthy now (empty: healthy); see ``_health.judge``."""
    return judge(snap).problems

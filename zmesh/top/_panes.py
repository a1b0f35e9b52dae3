"""The panes of ``zmesh top``: the header, the tabs, and one table per pane.

Each draws rows of a ``View`` (``rows``: the window of them that fits),
marking the selected row of the focused pane. Pure, as ``_render`` is.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from zmesh.top._fit import Cell, Column, Fitted
from zmesh.top._formats import (
    fmt_bytes,
    fmt_duration,
    fmt_latency,
    fmt_minutes,
    fmt_pct,
    fmt_rate,
    state_text,
)
from zmesh.top._screen import Screen
from zmesh.top._view import (
    PANES,
    SORTS,
    EndpointRow,
    ReplicaRow,
    ServiceRow,
    View,
    describe_event,
)

# ------------------------------------------------------------------ header


def header(view: View, screen: Screen) -> RenderableType:
    h = view.header
    one = Text()
    one.append("zmesh top", style="bold")
    one.append(f"  agents {h.agents_ok}/{h.agents_total}")
    one.append(f"  procs {h.procs_running}/{h.procs_total}")
    if h.history:
        one.append(f" +{h.history} history", style="dim")
    one.append(f"  actors {h.actors_alive}")
    if h.failed:
        one.append(f" +{h.failed} failed in {fmt_minutes(h.keep)}", style="red")
    one.append(f"  services {h.services_ok} ok")
    if h.services_degraded:
        one.append(f" {h.services_degraded} degraded", style="red")
    two = Text()
    two.append(f"calls/s {fmt_rate(h.calls)}")
    two.append(f"  err/s {fmt_rate(h.errors)}", style="red" if h.errors else "")
    two.append(f"  over {h.window:g}s")
    two.append("  data " + ("-" if h.age is None else f"{h.age:.1f}s old"))
    if h.stale:
        two.append("  STALE", style="bold white on red")
    if screen.paused:
        two.append("  PAUSED", style="bold black on yellow")
    if screen.errors_only:
        two.append("  errors-only", style="bold red")
    if screen.filter and not screen.editing:
        two.append(f"  filter: {screen.filter}", style="cyan")
    return Group(one, two)


def tabs(screen: Screen, view: View) -> Text:
    counts = {
        "hosts": len(view.hosts),
        "procs": len(view.procs),
        "actors": len(view.endpoints) - 1,
        "services": len(view.services),  # the replicas are rows under them
        "events": len(view.events),
    }
    t = Text()
    for i, name in enumerate(PANES):
        label = f" {i + 1} {name} ({counts[name]}) "
        t.append(label, style="bold reverse" if i == screen.focus else "")
    return t


# ------------------------------------------------------------------ panes


def _fitted(
    pane: str, columns: Sequence[Column], rows: list[tuple[list[Cell], str]], sort: int
) -> Fitted:
    """The pane's table, its sort column marked ▼, laid out at draw time (``_fit``)."""
    sort_title = SORTS[pane][sort % len(SORTS[pane])][0]
    marked = [
        replace(c, title=f"{c.title}▼") if c.title == sort_title and sort else c for c in columns
    ]
    return Fitted(marked, rows)


def hosts_table(view: View, screen: Screen, rows: range | None = None) -> Fitted:
    rows_out: list[tuple[list[Cell], str]] = []
    for i in rows if rows is not None else range(len(view.hosts)):
        h = view.hosts[i]
        mem = f"{fmt_bytes(h.mem_used)}/{fmt_bytes(h.mem_total)}" if h.mem_total else "-"
        cells: list[Cell] = [
            h.label,
            h.address,
            str(h.procs),
            fmt_pct(h.cpu),
            mem,
            "-" if h.load is None else f"{h.load:.2f}",
            "-" if h.age is None else f"{h.age:.1f}s",
            state_text(h.state),
        ]
        rows_out.append((cells, _sel(screen, "hosts", i)))
    columns = [
        Column("host", cut="middle", min=6),
        Column("address", cut="middle", min=12),
        Column("procs", right=True),
        Column("cpu", right=True),
        Column("mem", right=True),
        Column("load", right=True, drop=2),
        Column("seen", right=True, drop=1),
        Column("state", fill=True),
    ]
    return _fitted("hosts", columns, rows_out, screen.sort.get("hosts", 0))


def procs_table(view: View, screen: Screen, rows: range | None = None) -> RenderableType:
    rows_out: list[tuple[list[Cell], str]] = []
    for i in rows if rows is not None else range(len(view.procs)):
        p = view.procs[i]
        style = _sel(screen, "procs", i) or ("dim" if p.history else "")
        cells: list[Cell] = [
            p.host,
            p.mesh,
            str(p.rank),
            str(p.pid or "-"),
            state_text(p.state),
            fmt_pct(p.cpu),
            fmt_bytes(p.rss),
            str(p.restarts),
            fmt_duration(p.uptime),
            p.reason,
        ]
        rows_out.append((cells, style))
    columns = [
        Column("host", cut="middle", min=5),
        Column("mesh", cut="middle", min=12),
        Column("rank", right=True),
        Column("pid", right=True),
        Column("state"),
        Column("cpu", right=True),
        Column("rss", right=True),
        Column("rst", right=True, drop=2),
        Column("up", right=True, drop=1),
        Column("exit", cut="end", min=4, fill=True, later=True),
    ]
    t = _fitted("procs", columns, rows_out, screen.sort.get("procs", 0))
    folded = view.header.history if not screen.show_history else 0
    if folded:
        return Group(t, Text(f"  +{folded} history rows folded (H shows them)", style="dim"))
    return t


def _actor_cells(e: EndpointRow, batched: bool) -> list[Cell]:
    cells: list[Cell] = [
        f"{e.mesh}/{e.actor}" if e.mesh else e.actor,
        e.endpoint,
        fmt_rate(e.calls),
        fmt_latency(e.p50),
        fmt_latency(e.p99),
        Text(fmt_rate(e.errors), style="red" if e.errors else ""),
        str(e.in_flight),
        str(e.queue),
    ]
    if batched:
        cells.append(str(e.batches_total) if e.batches_total else "-")
        cells.append(f"{e.mean_batch:.1f}" if e.mean_batch is not None else "-")
    return cells


def actors_table(view: View, screen: Screen, rows: range | None = None) -> Fitted:
    # The batching columns show once an endpoint is batched: the narrow
    # frame keeps its room otherwise.
    batched = any(e.batches_total for e in view.endpoints)
    batching = (
        [Column("batches", right=True, drop=2), Column("batch", right=True, drop=1)]
        if batched
        else []
    )
    columns = [
        Column("actor", cut="middle", min=12),
        Column("endpoint", cut="middle", min=8, fill=True),
        Column("calls/s", right=True),
        Column("p50", right=True),
        Column("p99", right=True),
        Column("err/s", right=True),
        Column("inflight", right=True),
        Column("queue", right=True),
        *batching,  # invocations of a batched endpoint; mean calls per invocation
    ]
    total, *rest = view.endpoints
    rows_out: list[tuple[list[Cell], str]] = [(_actor_cells(total, batched), "bold")]
    for i in rows if rows is not None else range(len(rest)):
        rows_out.append((_actor_cells(rest[i], batched), _sel(screen, "actors", i)))
    return _fitted("actors", columns, rows_out, screen.sort.get("actors", 0))


def service_lines(view: View) -> list[tuple[ServiceRow, ReplicaRow | None]]:
    """The services pane's rows: each service, then each of its replicas."""
    return [(s, r) for s in view.services for r in (None, *s.replicas)]


def service_warnings(view: View) -> list[str]:
    """The lines under the services table: one per service with a warning."""
    return [f"  ! {s.name}: {s.warning}" for s in view.services if s.warning]


def _service_cells(s: ServiceRow, batched: bool) -> list[Cell]:
    reps = s.replicas
    cells: list[Cell] = [
        s.name,
        f"{s.healthy}/{s.desired}",
        state_text(s.state or ("ok" if s.healthy >= s.desired else "degraded")),
        "",
        str(s.restarts),
        str(sum(r.in_flight for r in reps)) if reps else "-",
        str(sum(r.queue for r in reps)) if reps else "-",
        fmt_rate(sum(r.calls for r in reps)) if reps else "-",
        "",
        Text(s.last_failure, style="red" if s.healthy < s.desired else ""),
    ]
    return [*cells[:-1], "", *cells[-1:]] if batched else cells


def _replica_cells(r: ReplicaRow, batched: bool) -> list[Cell]:
    cells: list[Cell] = [
        f"  {r.mesh or r.index}",  # the mesh's name holds the index (name-r0-...)
        r.host,
        state_text(r.state),
        str(r.generation),
        str(r.restarts),
        str(r.in_flight),
        str(r.queue),
        fmt_rate(r.calls),
        fmt_latency(r.p50),
        r.last_failure,
    ]
    if batched:  # the mean calls per invocation of its batched endpoints
        cells.insert(-1, f"{r.mean_batch:.1f}" if r.mean_batch is not None else "-")
    return cells


def services_table(view: View, screen: Screen, rows: range | None = None) -> RenderableType:
    lines = service_lines(view)
    # The batch column shows once a replica's endpoint is batched, as in actors.
    batched = any(r.mean_batch is not None for s in view.services for r in s.replicas)
    rows_out: list[tuple[list[Cell], str]] = []
    for i in rows if rows is not None else range(len(lines)):
        s, r = lines[i]
        cells = _service_cells(s, batched) if r is None else _replica_cells(r, batched)
        rows_out.append((cells, _sel(screen, "services", i) or ("" if r is None else "dim")))
    columns = [
        Column("service", cut="middle", min=10),
        Column("replicas", cut="middle", min=5),  # healthy/desired; a replica's host
        Column("state"),
        Column("gen", right=True, drop=3),
        Column("rst", right=True),
        Column("inflight", right=True),
        Column("queue", right=True),
        Column("calls/s", right=True, drop=2),
        Column("p50", right=True),
        *([Column("batch", right=True, drop=4)] if batched else []),
        Column("last failure", cut="end", min=6, fill=True, later=True, drop=1),
    ]
    t = _fitted("services", columns, rows_out, screen.sort.get("services", 0))
    if not view.services:
        return Group(t, Text("  no services", style="dim"))
    warnings = service_warnings(view)
    if warnings:
        return Group(
            t, *(Text(w, style="yellow", no_wrap=True, overflow="ellipsis") for w in warnings)
        )
    return t


def events_lines(view: View, screen: Screen, rows: range | None = None) -> RenderableType:
    t = Table(box=None, expand=True, show_header=False, pad_edge=False, padding=(0, 1))
    t.add_column("time", no_wrap=True)
    t.add_column("event", no_wrap=True, overflow="ellipsis", ratio=1)
    for i in rows if rows is not None else range(len(view.events)):
        e = view.events[i]
        style = "red" if e.kind in ("Failed", "Timeout", "Unknown", "lost") else ""
        t.add_row(
            time.strftime("%H:%M:%S", time.localtime(e.time)),
            Text(describe_event(e), style=style),
            style=_sel(screen, "events", i) or None,
        )
    if not view.events:
        return Text("  no events yet", style="dim")
    return t


def _sel(screen: Screen, pane: str, i: int) -> str:
    if screen.pane == pane and screen.selected.get(pane, 0) == i and not screen.help:
        return "reverse"
    return ""

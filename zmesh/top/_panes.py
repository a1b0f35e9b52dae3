"""The panes of ``zmesh top``: the header, the tabs, and one table per pane.

Each draws rows of a ``View`` (``rows``: the window of them that fits),
marking the selected row of the focused pane. Pure, as ``_render`` is.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

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
from zmesh.top._view import PANES, SORTS, EndpointRow, View, describe_event

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
        "services": len(view.services),
        "events": len(view.events),
    }
    t = Text()
    for i, name in enumerate(PANES):
        label = f" {i + 1} {name} ({counts[name]}) "
        t.append(label, style="bold reverse" if i == screen.focus else "")
    return t


# ------------------------------------------------------------------ panes


def _table(pane: str, columns: Sequence[tuple[str, dict[str, Any]]], sort: int) -> Table:
    t = Table(box=box.SIMPLE_HEAD, expand=True, pad_edge=False, padding=(0, 1), show_edge=False)
    sort_title = SORTS[pane][sort % len(SORTS[pane])][0]
    for title, kw in columns:
        shown = f"{title}▼" if title == sort_title and sort else title
        t.add_column(shown, no_wrap=True, overflow="ellipsis", **kw)
    return t


_R: dict[str, Any] = {"justify": "right"}


def hosts_table(view: View, screen: Screen, rows: range | None = None) -> Table:
    t = _table(
        "hosts",
        [
            ("host", {"ratio": 2}),
            ("address", {"ratio": 3}),
            ("procs", _R),
            ("cpu", _R),
            ("mem", _R),
            ("load", _R),
            ("seen", _R),
            ("state", {}),
        ],
        screen.sort.get("hosts", 0),
    )
    for i in rows if rows is not None else range(len(view.hosts)):
        h = view.hosts[i]
        mem = f"{fmt_bytes(h.mem_used)}/{fmt_bytes(h.mem_total)}" if h.mem_total else "-"
        t.add_row(
            h.label,
            h.address,
            str(h.procs),
            fmt_pct(h.cpu),
            mem,
            "-" if h.load is None else f"{h.load:.2f}",
            "-" if h.age is None else f"{h.age:.1f}s",
            state_text(h.state),
            style=_sel(screen, "hosts", i),
        )
    return t


def _longest(names: Any, cap: int = 24) -> int:
    """A name column's minimum width: its longest name, up to ``cap`` (then it is cut)."""
    return min(cap, max((len(n) for n in names), default=4))


def procs_table(view: View, screen: Screen, rows: range | None = None) -> RenderableType:
    t = _table(
        "procs",
        [
            ("host", {"ratio": 1, "min_width": 4, "max_width": 12}),
            ("mesh", {"min_width": _longest(p.mesh for p in view.procs)}),
            ("rank", _R),
            ("pid", _R),
            ("state", {}),
            ("cpu", _R),
            ("rss", _R),
            ("rst", _R),
            ("up", _R),
            ("exit", {"ratio": 2, "min_width": 4}),
        ],
        screen.sort.get("procs", 0),
    )
    for i in rows if rows is not None else range(len(view.procs)):
        p = view.procs[i]
        style = _sel(screen, "procs", i) or ("dim" if p.history else "")
        t.add_row(
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
            style=style,
        )
    folded = view.header.history if not screen.show_history else 0
    if folded:
        return Group(t, Text(f"  +{folded} history rows folded (H shows them)", style="dim"))
    return t


def _actor_row(t: Table, e: EndpointRow, style: str, batched: bool) -> None:
    cells: list[Any] = [
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
    t.add_row(*cells, style=style)


def actors_table(view: View, screen: Screen, rows: range | None = None) -> Table:
    # The batching columns show once an endpoint is batched: the narrow
    # frame keeps its room otherwise.
    batched = any(e.batches_total for e in view.endpoints)
    batching = [("batches", _R), ("batch", _R)] if batched else []
    t = _table(
        "actors",
        [
            ("actor", {"min_width": _longest(f"{e.mesh}/{e.actor}" for e in view.endpoints[1:])}),
            ("endpoint", {"ratio": 2, "min_width": 8}),
            ("calls/s", _R),
            ("p50", _R),
            ("p99", _R),
            ("err/s", _R),
            ("inflight", _R),
            ("queue", _R),
            *batching,  # invocations of a batched endpoint; mean calls per invocation
        ],
        screen.sort.get("actors", 0),
    )
    total, *rest = view.endpoints
    _actor_row(t, total, "bold", batched)
    for i in rows if rows is not None else range(len(rest)):
        _actor_row(t, rest[i], _sel(screen, "actors", i), batched)
    return t


def services_table(view: View, screen: Screen, rows: range | None = None) -> RenderableType:
    t = _table(
        "services",
        [
            ("service", {"ratio": 2}),
            ("replicas", _R),
            ("restarts", _R),
            ("last failure", {"ratio": 3}),
            ("state", {}),
        ],
        screen.sort.get("services", 0),
    )
    for i in rows if rows is not None else range(len(view.services)):
        s = view.services[i]
        t.add_row(
            s.name,
            f"{s.healthy}/{s.desired}",
            str(s.restarts),
            s.last_failure,
            state_text(s.state or ("ok" if s.healthy >= s.desired else "degraded")),
            style=_sel(screen, "services", i),
        )
    if not view.services:
        return Group(t, Text("  no services", style="dim"))
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

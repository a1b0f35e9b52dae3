"""Rendering: a ``View`` and what the user is looking at, drawn with ``rich``.

Pure: no clock, no terminal, no sockets. Times shown are ages relative to
the snapshot's time, so a fixed snapshot always draws the same frame.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from zmesh.top._view import KEEP, PANES, SORTS, EndpointRow, Options, View, describe_event

WINDOWS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)

HELP = [
    ("q, Ctrl+C", "quit"),
    ("? h F1", "this help (any key closes it)"),
    ("Enter", "details of the selected row: mesh, rank, pid, host, log, last error, endpoints"),
    ("L", "the log of the selected proc, following new lines (procs pane)"),
    ("K", "stop the selected row's mesh (asks to confirm with y)"),
    ("Tab / 1-5", "focus a pane: 1 hosts, 2 procs, 3 actors, 4 services, 5 events"),
    ("↑ ↓ / j k", "move the selection; PgUp PgDn, g G: by page, to the ends"),
    ("/", "filter rows (Enter keeps it, Esc clears it)"),
    ("< >", "sort by the previous / next column (ties keep name order)"),
    ("Space", "pause / resume updates"),
    ("e", "errors-only: failed procs, endpoints with errors, failure events"),
    ("H", "show / fold history: dead generations and stopped meshes"),
    ("S", "the stack of every thread of the selected proc (procs pane)"),
    ("+ -", "widen / narrow the window rates and percentiles are over"),
]


@dataclass
class Screen:
    """What the user is looking at; the interactive loop changes it on keys."""

    focus: int = 2  # index in PANES
    selected: dict[str, int] = field(default_factory=dict)
    filter: str = ""
    editing: bool = False  # typing a filter
    errors_only: bool = False
    paused: bool = False
    help: bool = False
    sort: dict[str, int] = field(default_factory=dict)
    window: float = 10.0
    show_history: bool = False
    keep: float = KEEP  # seconds of history shown (and of the failed counter)
    stack: list[str] | None = None  # the stack view's lines, when open
    stack_title: str = ""
    stack_wanted: tuple[str, str, int] | None = None  # (agent address, mesh, rank) to ask
    overlay: str = "stack"  # what the overlay lines are: stack, detail, logs
    logs_wanted: tuple[str, str, int] | None = None  # the logs view to start following
    logs_key: tuple[str, str, int] | None = None  # the proc the open logs view follows
    confirm: str | None = None  # a mesh to stop, once the user says y
    stop_wanted: str | None = None  # confirmed: the loop stops it
    message: str = ""  # one line for the footer (what an action did)
    follow_events: bool = True  # the events pane's selection stays on the newest

    @property
    def pane(self) -> str:
        return PANES[self.focus]

    def options(self) -> Options:
        return Options(self.filter, self.errors_only, dict(self.sort), self.show_history, self.keep)


# ------------------------------------------------------------------ formats


def fmt_rate(v: float) -> str:
    if v == 0:
        return "0"
    if v < 10:
        return f"{v:.2f}"
    if v < 1000:
        return f"{v:.1f}"
    if v < 1e6:
        return f"{v / 1e3:.1f}k"
    return f"{v / 1e6:.1f}M"


def fmt_latency(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f}µs"
    if s < 1:
        return f"{s * 1e3:.1f}ms"
    return f"{s:.2f}s"


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.1f}{unit}" if v < 100 else f"{v:.0f}{unit}"
    return f"{n}B"


def fmt_duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f}s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def _minutes(s: float) -> str:
    return f"{s / 60:g}m" if s >= 60 else f"{s:g}s"


def fmt_pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}%"


_STATE_STYLE = {
    "Running": "green",
    "ok": "green",
    "Initializing": "yellow",
    "connecting": "yellow",
    "Stopping": "dim",
    "Stopped": "dim",
    "Failed": "bold red",
    "Timeout": "bold red",
    "Unknown": "red",
    "lost": "bold red",
    "STALE": "bold red",
}


def _state(s: str) -> Text:
    return Text(s, style=_STATE_STYLE.get(s, ""))


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
        one.append(f" +{h.failed} failed in {_minutes(h.keep)}", style="red")
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
            _state(h.state),
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
            _state(p.state),
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
            _state(s.state or ("ok" if s.healthy >= s.desired else "degraded")),
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


_PANE_DRAW = {
    "hosts": hosts_table,
    "procs": procs_table,
    "actors": actors_table,
    "services": services_table,
    "events": events_lines,
}


def _sel(screen: Screen, pane: str, i: int) -> str:
    if screen.pane == pane and screen.selected.get(pane, 0) == i and not screen.help:
        return "reverse"
    return ""


def pane_rows(view: View, pane: str) -> int:
    """How many selectable rows ``pane`` has."""
    if pane == "actors":
        return len(view.endpoints) - 1
    return len(getattr(view, pane))


def window_of(selected: int, n: int, height: int) -> range:
    """The rows to show so that ``selected`` is visible in ``height`` lines."""
    if height <= 0:
        return range(0)
    if n <= height:
        return range(n)
    start = min(max(0, selected - height // 2), n - height)
    return range(start, start + height)


# ------------------------------------------------------------------ frames


def render(view: View, screen: Screen, height: int | None = None) -> RenderableType:
    """One frame. ``height=None`` draws every pane in full (``--once``)."""
    if height is None:
        parts: list[RenderableType] = [header(view, screen)]
        for i, name in enumerate(PANES):
            parts.append(Text(f"\n{i + 1} {name}", style="bold underline"))
            if name == "events":
                n = len(view.events)
                parts.append(events_lines(view, screen, range(max(0, n - 20), n)))
            else:
                parts.append(_PANE_DRAW[name](view, screen))
        return Group(*parts)
    parts = [header(view, screen), tabs(screen, view)]
    footer = _footer(screen)
    body = max(3, height - 4)  # header 2, tabs 1, footer 1
    if screen.help:
        help_t = Table(box=None, show_header=False, padding=(0, 2))
        help_t.add_column(style="bold cyan", no_wrap=True)
        help_t.add_column()
        for k, what in HELP:
            help_t.add_row(k, what)
        parts.append(help_t)
        return Group(*parts, footer)
    if screen.stack is not None:
        room = max(0, body - 1)
        # The logs view follows the newest lines; the others start at the top.
        lines = screen.stack[-room:] if screen.overlay == "logs" and room else screen.stack[:room]
        title = (
            f"stack of {screen.stack_title}" if screen.overlay == "stack" else screen.stack_title
        )
        parts.append(Text(title, style="bold underline", no_wrap=True, overflow="ellipsis"))
        parts.extend(Text(ln, no_wrap=True, overflow="ellipsis") for ln in lines)
        parts.extend(Text("") for _ in range(max(0, room - len(lines))))
        return Group(*parts, Text(f"any key closes the {screen.overlay}", style="dim"))
    pane = screen.pane
    tail = 0
    if pane != "events" and view.events and body >= 14:
        tail = min(len(view.events), max(2, body // 5))
    # Table chrome: header row and rule, plus the Total row for actors.
    chrome = (
        2 + (1 if pane == "actors" else 0) + (1 if pane == "services" and not view.services else 0)
    )
    if pane == "procs" and view.header.history and not screen.show_history:
        chrome += 1  # the "history rows folded" line
    room = body - chrome - (tail + 1 if tail else 0)
    if pane == "events":
        room = body
    n = pane_rows(view, pane)
    rows = window_of(screen.selected.get(pane, 0), n, room)
    parts.append(_PANE_DRAW[pane](view, screen, rows))
    shown = len(rows) + chrome if pane != "events" else len(rows)
    if tail:
        parts.append(Text("events", style="bold underline"))
        m = len(view.events)
        parts.append(events_lines(view, Screen(focus=screen.focus), range(m - tail, m)))
        shown += tail + 1
    parts.extend(Text("") for _ in range(max(0, body - shown)))
    return Group(*parts, footer)


def _footer(screen: Screen) -> Text:
    if screen.confirm is not None or screen.message:
        style = "bold yellow" if screen.confirm is not None else "bold"
        return Text(screen.message, style=style, no_wrap=True, overflow="ellipsis")
    if screen.editing:
        t = Text("filter: ", style="bold cyan")
        t.append(screen.filter + "█")
        t.append("   Enter keep  Esc clear", style="dim")
        return t
    return Text(
        "q quit  h help  Enter detail  L logs  S stack  K stop  Tab/1-5 pane  j/k move  "
        "/ filter  < > sort  Space pause  e errors  H history  +/- window",
        style="dim",
        no_wrap=True,
        overflow="ellipsis",
    )

"""Rendering: a ``View`` and what the user is looking at, drawn with ``rich``.

Pure: no clock, no terminal, no sockets. Times shown are ages relative to
the snapshot's time, so a fixed snapshot always draws the same frame.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from zmesh.top._formats import (  # noqa: F401  (imported from here by the commands)
    fmt_bytes,
    fmt_duration,
    fmt_latency,
    fmt_pct,
    fmt_rate,
)
from zmesh.top._panes import (
    actors_table,
    events_lines,
    header,
    hosts_table,
    procs_table,
    service_lines,
    service_warnings,
    services_table,
    tabs,
)
from zmesh.top._screen import HELP, WINDOWS, Screen  # noqa: F401  (WINDOWS: for _app)
from zmesh.top._view import PANES, View

_PANE_DRAW = {
    "hosts": hosts_table,
    "procs": procs_table,
    "actors": actors_table,
    "services": services_table,
    "events": events_lines,
}


def pane_rows(view: View, pane: str) -> int:
    """How many selectable rows ``pane`` has."""
    if pane == "actors":
        return len(view.endpoints) - 1
    if pane == "services":
        return len(service_lines(view))  # each service, then its replicas
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
    if pane == "services":
        chrome += len(service_warnings(view))
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

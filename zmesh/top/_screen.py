"""What the user is looking at in ``zmesh top``: the ``Screen``, and the keys' help.

The interactive loop (``_app``, ``_actions``) changes a ``Screen`` on keys;
``_render`` draws a ``View`` as the screen says.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zmesh.top._view import KEEP, PANES, Options

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

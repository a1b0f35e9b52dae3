"""``S`` in ``zmesh top``: which proc it asks about, and how the answer is drawn."""

from __future__ import annotations

import io

from rich.console import Console
from test_top_health import agent, mesh, rank, snap

from zmesh.top._app import apply_key
from zmesh.top._render import Screen, render
from zmesh.top._view import derive


def test_s_asks_for_the_selected_proc_and_any_key_closes_the_view() -> None:
    s = snap(agent(mesh("train-0a1b2c3d", rank(0, "Running"), rank(1, "Running"))))
    view = derive(s)
    screen = Screen(focus=1)  # the procs pane
    assert apply_key(screen, "j", view, 10) and apply_key(screen, "S", view, 10)
    assert screen.stack_wanted == ("tcp://a:1", "train-0a1b2c3d", 1)
    screen.stack = ["Thread 0x1 (most recent call first):", '  File "t.py", line 3 in stuck_here']
    console = Console(record=True, width=100, file=io.StringIO(), color_system=None)
    console.print(render(view, screen, 24))
    out = console.export_text()
    assert "stack of train-0a1b2c3d[1] pid 101 on a" in out and "in stuck_here" in out
    assert len(out.splitlines()) == 24 and "any key closes" in out.splitlines()[-1]
    assert apply_key(screen, "x", view, 10) and screen.stack is None
    # Elsewhere than the procs pane, S does nothing.
    other = Screen(focus=2)
    assert apply_key(other, "S", view, 10) and other.stack_wanted is None


def test_the_stack_view_shortens_paths_to_fit_a_terminal() -> None:
    from zmesh.top._app import _short_path

    line = '  File "/very/long/site-packages/pkg/mod.py", line 12 in work'
    assert _short_path(line) == '  File "mod.py", line 12 in work'
    assert _short_path("Current thread 0x1 (most recent call first):").startswith("Current")

"""``zmesh top`` as a tool: Enter, L, K (with its confirmation), h/F1, events that follow."""

from __future__ import annotations

import io

from rich.console import Console
from test_top_health import agent, mesh, rank, snap

from zmesh.top._app import apply_key, parse_keys
from zmesh.top._render import Screen, render
from zmesh.top._view import derive


def _text(view: object, screen: Screen, width: int = 80, height: int = 24) -> str:
    console = Console(record=True, width=width, file=io.StringIO(), color_system=None)
    console.print(render(view, screen, height))  # type: ignore[arg-type]
    return console.export_text()


def test_enter_shows_the_selected_procs_details() -> None:
    view = derive(snap(agent(mesh("train-0a1b2c3d", rank(0, "Running"), rank(1, "Failed")))))
    screen = Screen(focus=1)
    assert apply_key(screen, "j", view, 10) and apply_key(screen, "enter", view, 10)
    out = _text(view, screen)
    assert "train-0a1b2c3d[1]" in out and "agent      tcp://a:1" in out
    assert "pid        101" in out and "state      Failed" in out
    assert apply_key(screen, "x", view, 10) and screen.stack is None


def test_l_follows_the_selected_procs_log_and_closing_stops_it() -> None:
    view = derive(snap(agent(mesh("train-0a1b2c3d", rank(0, "Running")))))
    screen = Screen(focus=1)
    assert apply_key(screen, "L", view, 10)
    assert screen.logs_wanted == ("tcp://a:1", "train-0a1b2c3d", 0) and screen.overlay == "logs"
    screen.logs_key, screen.logs_wanted = screen.logs_wanted, None
    screen.stack = [f"line {i}" for i in range(100)]
    out = _text(view, screen)
    assert "line 99" in out and "line 0\n" not in out  # the newest lines show
    assert apply_key(screen, "x", view, 10) and screen.logs_key is None


def test_k_stops_only_after_y() -> None:
    view = derive(snap(agent(mesh("train-0a1b2c3d", rank(0, "Running"), rank(1, "Running")))))
    screen = Screen(focus=1)
    assert apply_key(screen, "K", view, 10)
    assert screen.confirm == "train-0a1b2c3d" and "(2 live rank(s))? y" in _text(view, screen, 100)
    assert apply_key(screen, "n", view, 10)
    assert screen.stop_wanted is None and screen.message == "train-0a1b2c3d not stopped"
    assert apply_key(screen, "K", view, 10) and apply_key(screen, "y", view, 10)
    assert screen.stop_wanted == "train-0a1b2c3d"


def test_h_and_f1_open_help_and_ctrl_c_quits() -> None:
    view = derive(snap(agent(mesh("m-0a1b2c3d", rank(0, "Running")))))
    for key in ("h", *parse_keys(b"\x1bOP"), *parse_keys(b"\x1b[11~")):
        screen = Screen()
        assert apply_key(screen, key, view, 10) and screen.help, key
    assert not apply_key(Screen(), "ctrl-c", view, 10)


def test_at_80_columns_mesh_names_win_over_host_labels() -> None:
    long_host = agent(mesh("scorer-r0-4fd30bdf", rank(0, "Running")))
    view = derive(snap(long_host))
    out = _text(view, Screen(focus=1), 80)
    assert "scorer-r0-4fd30bdf" in out, out

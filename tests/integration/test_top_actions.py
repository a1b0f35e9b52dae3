"""``zmesh top`` as a tool, in a real terminal (tmux): Enter, L, S, K, h, Ctrl+C at 80x24.

The mesh is an embedded agent's, in another script, found with no arguments
(the registry), so K stops it as this agent's user.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_logs_cli import SCRIPT, Script
from test_top import Tmux

from _helpers import own_runtime_dir, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


@pytest.fixture
def talker(runtime_dir: str, tmp_path: Path) -> Iterator[Script]:
    path = tmp_path / "talker.py"
    path.write_text(SCRIPT)
    s = Script(path, {"ZMESH_FORWARD_LOGS": "0"})
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with own_runtime_dir(monkeypatch) as path:
        yield path


def _ps() -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-m", "zmesh", "ps", "--all", "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    rows: list[dict[str, object]] = json.loads(done.stdout)
    return rows


def test_enter_l_s_k_h_and_ctrl_c_in_80_columns(talker: Script, tmp_path: Path) -> None:
    talker.send("say printed-before-top")
    talker.until("DONE")
    mesh = str(_ps()[0]["mesh"])
    err = tmp_path / "top.err"
    tmux = Tmux()
    try:
        # The shell outlives Ctrl+C (a trapped signal is reset in its child) to say how top ended.
        cmd = f"trap true INT; {sys.executable} -m zmesh top 2>{err}; echo TOP-EXIT=$?; sleep 60"
        tmux.start(["sh", "-c", cmd], 80, 24)
        wait_for(lambda: "procs 2/2" in tmux.screen(), 30, "the first frame")
        tmux.keys("2")  # the procs pane: full mesh names even at 80 columns
        wait_for(lambda: tmux.screen().count(mesh) == 2, 10, "both ranks with the full name")

        tmux.press("Enter", lambda s: f"{mesh}[0]" in s, 10, "the detail view")
        screen = tmux.screen()
        assert ".0.g1.log" in screen and "endpoints  own, say" in screen, screen
        tmux.press("Escape", lambda s: "any key closes" not in s, 10, "the view closed")

        tmux.press("L", lambda s: "printed-before-top" in s, 15, "the log so far")
        talker.send("say printed-while-watching")
        talker.until("DONE")
        wait_for(lambda: "printed-while-watching" in tmux.screen(), 15, "the log to follow")
        tmux.press("x", lambda s: "printed-before-top" not in s, 10, "the logs view closed")

        tmux.press("S", lambda s: "Thread" in s, 15, "the stack")
        tmux.keys("x")

        tmux.press("h", lambda s: "Enter" in s and "stop the selected" in s, 10, "help")
        tmux.keys("x")

        tmux.press("K", lambda s: f"stop mesh {mesh} (2 live rank(s))?" in s, 10, "confirm")
        tmux.press("n", lambda s: f"{mesh} not stopped" in s, 10, "not stopped")
        assert all(p["state"] == "Running" for p in _ps())
        tmux.press("K", lambda s: "? y to stop" in s, 10, "confirm again")
        tmux.press("y", lambda s: f"stopped {mesh}" in s, 15, "the stop")
        wait_for(lambda: all(p["state"] == "Stopped" for p in _ps()), 30, "the ranks stopped")

        tmux.press("C-c", lambda s: "TOP-EXIT=0" in s, 15, "top to quit on Ctrl+C")
        assert "Traceback" not in tmux.screen() and err.read_text() == "", err.read_text()
    finally:
        tmux.close()
    assert os.path.exists(err)


def test_s_finds_the_proc_by_its_agent_and_the_detail_keys_act(
    talker: Script, script_path_2: Path, tmp_path: Path
) -> None:
    # Two scripts: two embedded agents, both labelled "local".
    other = Script(script_path_2, {"ZMESH_FORWARD_LOGS": "0"})
    tmux = Tmux()
    try:
        other.send("say from-the-second-script")
        other.until("DONE")
        meshes = sorted({str(p["mesh"]) for p in _ps()})
        assert len(meshes) == 2, meshes
        pane = tmux.start([sys.executable, "-m", "zmesh", "top"], 100, 30)
        wait_for(lambda: "procs 4/4" in tmux.screen(), 30, "both scripts")
        tmux.keys("2")
        for mesh in meshes:  # each through a filter: the hosts pane does not list its agent
            tmux.keys("/")
            tmux.keys("-l", mesh)
            tmux.keys("Enter")
            wait_for(functools.partial(_shows, tmux, f"filter: {mesh}"), 10, "the filter")
            tmux.press("S", lambda s: "Thread" in s or "error" in s, 15, "the stack")
            assert "error" not in tmux.screen(), tmux.screen()
            tmux.keys("x")
            wait_for(lambda: "Thread" not in tmux.screen(), 10, "the stack closed")
            tmux.keys("Escape")
        # Enter, then the keys its footer offers: S and L act on that proc.
        tmux.keys("/")
        tmux.keys("-l", meshes[0] if "from-the-second" in _log_of(meshes[0]) else meshes[1])
        tmux.keys("Enter")
        tmux.press("Enter", lambda s: "L logs  S stack" in s, 10, "the detail view")
        tmux.press("S", lambda s: "Thread" in s, 15, "the stack from the detail view")
        tmux.keys("x")
        tmux.press("Enter", lambda s: "L logs  S stack" in s, 10, "the detail view again")
        tmux.press("L", lambda s: "from-the-second-script" in s, 15, "the log from the detail")
        tmux.keys("x")
        tmux.quit(pane)
    finally:
        tmux.close()
        other.close()


@pytest.fixture
def script_path_2(tmp_path: Path) -> Path:
    path = tmp_path / "talker2.py"
    path.write_text(SCRIPT)
    return path


def _shows(tmux: Tmux, text: str) -> bool:
    return text in tmux.screen()


def _log_of(mesh: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "zmesh", "logs", mesh],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return done.stdout

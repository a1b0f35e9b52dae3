"""Live ``zmesh top`` follows what runs now: scripts started after it appear, ended ones go.

In a real terminal (tmux) at 80x24 and 200x50, with no agents named (the
registry), as a newcomer runs it: top first, then scripts.
"""

from __future__ import annotations

import shutil
import sys
import time
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
def runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with own_runtime_dir(monkeypatch, unset=("ZMESH_FORWARD_LOGS",)) as path:
        yield path


@pytest.fixture
def script_path(tmp_path: Path) -> Path:
    path = tmp_path / "talker.py"
    path.write_text(SCRIPT)
    return path


@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=["80x24", "200x50"])
def test_top_shows_scripts_started_after_it_and_their_normal_exit(
    runtime_dir: str, script_path: Path, tmp_path: Path, size: tuple[int, int]
) -> None:
    err = tmp_path / "top.err"
    env = {"ZMESH_FORWARD_LOGS": "0"}
    tmux = Tmux()
    first: Script | None = None
    later: Script | None = None
    try:
        first = Script(script_path, env)
        cmd = f"{sys.executable} -m zmesh top 2>{err}; echo TOP-EXIT=$?; sleep 60"
        tmux.start(["sh", "-c", cmd], *size)
        wait_for(lambda: "procs 2/2" in tmux.screen(), 30, "the first script in top")

        later = Script(script_path, env)  # READY: its mesh runs, its agent is registered
        t0 = time.monotonic()
        wait_for(lambda: "procs 4/4" in tmux.screen(), 30, "the script started after top")
        shown = time.monotonic() - t0
        assert "agents 2/2" in tmux.screen()
        # 2 s is the goal on a quiet machine; this one is shared.
        assert shown < 4.0, f"a script started after top took {shown:.1f}s to show (goal: 2 s)"

        later.close()  # its script ends normally: its agent exits, not a partition
        later = None
        wait_for(lambda: "agents 1/1" in tmux.screen(), 30, "the ended script's agent gone")
        tmux.keys("5")  # the events pane
        wait_for(lambda: "agent exited" in tmux.screen(), 10, "the exit in the event log")
        wait_for(lambda: "procs 2/2" in tmux.screen(), 10, "the first script still shown")
        screen = tmux.screen()
        for wrong in ("STALE", "lost", "partition", "Traceback"):
            assert wrong not in screen, screen
        first.close()
        first = None
        wait_for(lambda: "agents 0/0" in tmux.screen(), 30, "both agents gone")
        assert "STALE" not in tmux.screen() and "partition" not in tmux.screen()
        again = Script(script_path, env)  # top with no agent left still follows
        try:
            wait_for(lambda: "procs 2/2" in tmux.screen(), 30, "a third script")
        finally:
            again.close()
        tmux.keys("q")
        wait_for(lambda: "TOP-EXIT=0" in tmux.screen(), 15, "top to quit")
        assert err.read_text() == "", err.read_text()
    finally:
        for s in (first, later):
            if s is not None:
                s.close()
        tmux.close()


def test_top_started_before_any_agent_waits_for_one(
    runtime_dir: str, script_path: Path, tmp_path: Path
) -> None:
    tmux = Tmux()
    script: Script | None = None
    try:
        pane = tmux.start([sys.executable, "-m", "zmesh", "top"], 80, 24)
        wait_for(lambda: "agents 0/0" in tmux.screen(), 30, "top with no agent yet")
        script = Script(script_path, {"ZMESH_FORWARD_LOGS": "0"})
        wait_for(lambda: "procs 2/2" in tmux.screen(), 10, "the script in top")
        tmux.quit(pane)
    finally:
        if script is not None:
            script.close()
        tmux.close()


ONE_PROC = """
import sys
import zmesh


class Idle(zmesh.Actor):
    @zmesh.endpoint
    def ping(self) -> int:
        return 1


mesh = Idle.options(name="idle").as_actor().get(timeout=120)
print("READY", flush=True)
sys.stdin.readline()
"""


@pytest.mark.stress
def test_top_through_six_scripts_starting_and_ending_at_once(
    runtime_dir: str, tmp_path: Path
) -> None:
    path = tmp_path / "idle.py"
    path.write_text(ONE_PROC)
    err = tmp_path / "top.err"
    tmux = Tmux()
    scripts: list[Script] = []
    try:
        cmd = f"{sys.executable} -m zmesh top 2>{err}; echo TOP-EXIT=$?; sleep 60"
        tmux.start(["sh", "-c", cmd], 120, 40)
        wait_for(lambda: "agents 0/0" in tmux.screen(), 30, "top with no agent yet")
        scripts = [Script(path, {"ZMESH_FORWARD_LOGS": "0"}) for _ in range(6)]
        wait_for(lambda: "agents 6/6" in tmux.screen(), 30, "the six scripts' agents")
        wait_for(lambda: "procs 6/6" in tmux.screen(), 30, "the six scripts' procs")
        for s in scripts:  # all end together: six normal exits, no partition
            assert s.p.stdin is not None
            s.p.stdin.close()
        for s in scripts:
            s.close()
        scripts = []
        wait_for(lambda: "agents 0/0" in tmux.screen(), 30, "every agent gone")
        tmux.keys("5")
        wait_for(lambda: tmux.screen().count("agent exited") >= 6, 10, "six exits")
        screen = tmux.screen()
        for wrong in ("STALE", "lost", "partition", "Traceback"):
            assert wrong not in screen, screen
        tmux.keys("q")
        wait_for(lambda: "TOP-EXIT=0" in tmux.screen(), 15, "top to quit")
        assert err.read_text() == "", err.read_text()
    finally:
        for s in scripts:
            s.close()
        tmux.close()

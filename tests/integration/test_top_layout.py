"""``zmesh top`` in a real terminal at 80 x 24 and 200 x 50, with a long mesh name.

At 80 columns every column stays, numbers keep their units, pids every
digit, and a long name is cut in the middle (its unique suffix stays); at
200 columns the name shows whole.
"""

from __future__ import annotations

import re
import shutil
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from test_top import Busy, Tmux

import zmesh
from zmesh.testing import AgentProcess

from _helpers import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

# The test run's COLUMNS and LINES would fix rich's idea of the terminal's size.
TOP = ["env", "-u", "COLUMNS", "-u", "LINES", sys.executable, "-m", "zmesh", "top"]
LONG = "an-embedding-service-with-a-rather-long-descriptive-name"


@pytest.fixture
def long_named(cluster: list[AgentProcess]) -> Iterator[tuple[str, list[int]]]:
    """A 2-proc mesh with a long name on one agent, called in a loop."""
    mesh = Busy.options(procs=2, name=LONG).as_actor().get(timeout=60)
    pids = sorted(mesh.pid.call().get(timeout=30).values())
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                mesh.incr.call(1).get(timeout=10)
            except zmesh.ZmeshError:
                time.sleep(0.01)

    thread = threading.Thread(target=load, name="load", daemon=True)
    thread.start()
    try:
        yield ",".join(a.control for a in cluster), pids
    finally:
        stop.set()
        thread.join(15)
        mesh.stop().get(timeout=30)


def _table(screen: str, first: str) -> tuple[list[str], list[str]]:
    """The head of the table whose first column is ``first``, and its rows."""
    lines = screen.splitlines()
    at = next(
        i for i, ln in enumerate(lines) if ln.startswith(first + " ") and "──" in lines[i + 1]
    )
    rows = []
    for ln in lines[at + 2 :]:
        if not ln.strip() or ln.startswith(("events", "q quit")):
            break
        rows.append(ln)
    return lines[at].split(), rows


def test_top_at_80x24_keeps_units_pids_and_columns_and_200x50_shows_names_whole(
    long_named: tuple[str, list[int]],
) -> None:
    agents, pids = long_named
    tmux = Tmux()
    try:
        pane = tmux.start([*TOP, "--agents", agents], 80, 24)
        wait_for(lambda: "procs 2/2" in tmux.screen(), 30, "the first frame")
        tmux.press("2", lambda s: str(pids[-1]) in s, 20, "the procs pane")
        screen = tmux.screen()
        assert all(len(ln) <= 80 for ln in screen.splitlines()), screen
        head, rows = _table(screen, "host")
        assert head == "host mesh rank pid state cpu rss rst up exit".split(), screen
        for pid in pids:
            row = next(r for r in rows if f" {pid} " in r).split()  # every digit of the pid
            assert row[1].startswith("an-embedding") and "…" in row[1], screen
            assert re.fullmatch(r"[0-9a-f]{4,}", row[1].split("-")[-1]), screen  # its suffix
            assert row[4] == "Running" and row[5].endswith("%"), screen
            assert row[6][-1] in "KMG", screen  # rss keeps its unit

        tmux.press("3", lambda s: " incr " in s and ("µs" in s or "ms" in s), 20, "the actors pane")
        screen = tmux.screen()
        head, rows = _table(screen, "actor")
        assert head == "actor endpoint calls/s p50 p99 err/s inflight queue".split(), screen
        incr = next(r for r in rows if " incr " in r).split()
        assert incr[0].startswith("an-embedding") and "…" in incr[0], screen
        assert re.fullmatch(r"[0-9.]+(µs|ms|s)", incr[3]), screen  # p50 with its unit
        tmux.quit(pane)
        tmux.close()

        tmux = Tmux()
        pane = tmux.start([*TOP, "--agents", agents], 200, 50)
        wait_for(lambda: "procs 2/2" in tmux.screen(), 30, "the first frame")
        tmux.press("2", lambda s: str(pids[-1]) in s, 20, "the procs pane")
        screen = tmux.screen()
        head, rows = _table(screen, "host")
        assert head == "host mesh rank pid state cpu rss rst up exit".split(), screen
        assert all(r.split()[1].startswith(LONG + "-") and "…" not in r for r in rows), screen
        tmux.press("3", lambda s: " incr " in s, 20, "the actors pane")
        assert f"{LONG}-" in tmux.screen() and "…" not in tmux.screen().split("q quit")[0]
        tmux.quit(pane)
    finally:
        tmux.close()

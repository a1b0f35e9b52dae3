"""``zmesh stack`` against a real mesh on the embedded agent: a thread blocked in a
sync endpoint and a thread holding the GIL in pure Python both show."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

import zmesh
from zmesh._client.control import local as _local

from _helpers import pid_alive, wait_for

pytestmark = pytest.mark.slow


class Stuck(zmesh.Actor):
    @zmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

    @zmesh.endpoint
    def parked_in_a_distinctive_sleep(self) -> None:
        time.sleep(60)

    @zmesh.endpoint
    def spinning_in_pure_python(self) -> None:
        x = 0
        while True:
            x += 1


def zmesh_cmd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zmesh", *args], capture_output=True, text=True, timeout=60
    )


def embedded_agent() -> str:
    """The control address of the agent this client started for itself."""
    assert _local.configured_agents() is None, "these tests use the embedded default agent"
    return _local._embedded[0][1]


def test_stack_names_the_function_each_proc_is_stuck_in() -> None:
    mesh = Stuck.options(procs=2, name="stuck").as_actor().get(timeout=60)
    pids = mesh.pid.call().get(timeout=30).values()
    agent = embedded_agent()
    mesh.slice(procs=0).parked_in_a_distinctive_sleep.broadcast()
    mesh.slice(procs=1).spinning_in_pure_python.broadcast()

    def both_stuck() -> subprocess.CompletedProcess[str] | None:
        done = zmesh_cmd("stack", "stuck", "--agents", agent, "--json")
        if done.returncode != 0:
            return None
        rows = json.loads(done.stdout)
        seen = ["in parked_in_a_distinctive_sleep" in rows[0]["stack"],
                "in spinning_in_pure_python" in rows[1]["stack"]]  # fmt: skip
        return done if all(seen) else None

    done = wait_for(both_stuck, 30, "both endpoints to show in the stacks")
    rows = json.loads(done.stdout)
    assert [(r["rank"], r["pid"]) for r in rows] == [(0, pids[0]), (1, pids[1])]
    assert all(r["ok"] and r["mesh"].startswith("stuck-") for r in rows)
    # Every thread: the asyncio loop's too, not only the endpoint's.
    assert all("Current thread" in r["stack"] and "run_forever" in r["stack"] for r in rows)

    # One rank, by the full name as ps shows it, in text.
    started = time.monotonic()
    done = zmesh_cmd("stack", rows[1]["mesh"], "1", "--agents", agent)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 20
    assert f"{rows[1]['mesh']}[1] pid {pids[1]}" in done.stdout
    assert "in spinning_in_pure_python" in done.stdout
    assert "parked_in_a_distinctive_sleep" not in done.stdout
    # SIGUSR1 no longer kills a proc: both are alive and still Running.
    assert all(pid_alive(p) for p in pids)
    assert all(r.status.value == "Running" for r in mesh.state().ranks.values())
    mesh.stop().get(timeout=30)


def test_stack_of_an_unknown_mesh_or_rank_says_so() -> None:
    mesh = Stuck.options(name="present").as_actor().get(timeout=60)
    agent = embedded_agent()
    done = zmesh_cmd("stack", "absent", "--agents", agent)
    assert done.returncode == 2
    assert "no mesh named 'absent'" in done.stderr and "present-" in done.stderr
    done = zmesh_cmd("stack", "present", "3", "--agents", agent)
    assert done.returncode == 2 and "rank 3" in done.stderr
    mesh.stop().get(timeout=30)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_s_in_top_shows_the_stack_of_the_selected_proc() -> None:
    from test_top import Tmux

    mesh = Stuck.options(name="hung").as_actor().get(timeout=60)
    mesh.parked_in_a_distinctive_sleep.broadcast()
    agent = embedded_agent()
    tmux = Tmux()
    try:
        pane = tmux.start([sys.executable, "-m", "zmesh", "top", "--agents", agent], 100, 30)
        wait_for(lambda: "procs 1/1" in tmux.screen(), 30, "the first frame")
        # Once top reads keys: cbreak mode drops earlier ones.
        tmux.press("2", lambda s: " rst " in s and "hung" in s, 30, "the procs pane")
        tmux.press(
            "S",
            lambda s: "in parked_in_a_distinctive_sleep" in s,
            15,
            "the stack view naming the blocked endpoint",
        )
        assert "stack of hung-" in tmux.screen() and 'File "test_stack.py"' in tmux.screen()
        tmux.press("x", lambda s: "stack of" not in s, 10, "any key to close the stack")
        tmux.quit(pane)
    finally:
        tmux.close()
        mesh.stop().get(timeout=30)

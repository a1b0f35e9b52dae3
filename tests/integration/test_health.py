"""``zmesh status`` judges what is alive now; ``ps`` folds history. Real procs, real kill -9."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

import zmesh
from zmesh.testing import AgentProcess

from _helpers import wait_for, wait_gone

pytestmark = pytest.mark.slow


class Echo(zmesh.Actor):
    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()


def zmesh_cmd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zmesh", *args], capture_output=True, text=True, timeout=timeout
    )


def status(agents: str) -> subprocess.CompletedProcess[str]:
    return zmesh_cmd("status", "--agents", agents)


def wait_status(agents: str, code: int, timeout: float, what: str) -> str:
    """Run ``zmesh status`` until it exits ``code``; its output."""
    done = wait_for(lambda: (d := status(agents)).returncode == code and d, timeout, what)
    return done.stdout


def ps(agents: str, *flags: str) -> list[dict[str, object]]:
    done = zmesh_cmd("ps", "--agents", agents, "--json", *flags)
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, object]] = json.loads(done.stdout)
    return rows


def test_status_is_1_while_a_service_heals_and_0_once_it_has(
    cluster: list[AgentProcess],
) -> None:
    agents = ",".join(a.control for a in cluster)
    # A slow first respawn, so "being replaced" lasts long enough to be seen.
    svc = Echo.options(replicas=2, backoff_initial=6.0).as_service().get(timeout=60)
    try:
        wait_status(agents, 0, 30, "a healthy service")
        replica = svc.replica(0)
        assert replica is not None
        pid = replica.pid.call_one().get(timeout=10)
        os.kill(pid, signal.SIGKILL)  # a replica proc of ours, by the pid it reported
        wait_gone([pid], 10, "the killed replica proc")
        out = wait_status(agents, 1, 20, "status to see the replica being replaced")
        assert "service echo: 1/2 replicas healthy" in out, out
        out = wait_status(agents, 0, 60, "status to see the service healed")
        assert "healthy" in out and "history: 1 proc(s)" in out, out
        # The dead replica is history: folded in ps, shown with --all.
        assert pid not in [r["pid"] for r in ps(agents)]
        old = [r for r in ps(agents, "--all") if r["pid"] == pid]
        assert len(old) == 1 and old[0]["history"] and old[0]["state"] == "Failed", old
        assert len([r for r in ps(agents) if r["state"] == "Running"]) == 2
    finally:
        svc.stop().get(timeout=30)


def test_status_is_1_while_a_failed_mesh_is_unreplaced_and_0_once_its_owner_stops_it(
    cluster: list[AgentProcess],
) -> None:
    agents = ",".join(a.control for a in cluster)
    mesh = Echo.options(name="lonely").as_actor().get(timeout=60)
    stopped = False
    try:
        pid = mesh.pid.call_one().get(timeout=10)
        wait_status(agents, 0, 30, "a healthy mesh")
        os.kill(pid, signal.SIGKILL)
        wait_gone([pid], 10, "the killed proc")
        out = wait_status(agents, 1, 20, "status to report the dead mesh")
        assert "lonely-" in out and "is Failed: killed by SIGKILL" in out, out
        # Still 1 a moment later: nothing replaces it, so it stays a problem.
        assert status(agents).returncode == 1
        mesh.stop().get(timeout=30)
        stopped = True
        out = wait_status(agents, 0, 20, "a mesh stopped by its owner to be no problem")
        assert "healthy" in out
        done = zmesh_cmd("status", "--agents", agents, "--json")
        judged = json.loads(done.stdout)
        assert done.returncode == 0 and judged["state"] == "healthy" and not judged["problems"]
        assert [m["verdict"] for m in judged["meshes"] if m["mesh"].startswith("lonely-")] == [
            "history"
        ]
        assert [r for r in ps(agents) if str(r["mesh"]).startswith("lonely-")] == []
        assert [r["pid"] for r in ps(agents, "--all") if r["history"]] == [pid]
    finally:
        if not stopped:
            mesh.stop().get(timeout=30)


def test_status_is_2_when_an_agent_does_not_answer(cluster: list[AgentProcess]) -> None:
    cluster[1].kill()  # our own agent, by pid
    cluster[1].popen.wait(10)
    agents = ",".join(a.control for a in cluster)
    done = zmesh_cmd("status", "--agents", agents, "--timeout", "2")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "unreachable" in done.stdout and cluster[1].control in done.stdout


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_top_folds_a_stopped_mesh_and_h_shows_it(cluster: list[AgentProcess]) -> None:
    from test_top import Tmux

    agents = ",".join(a.control for a in cluster)
    done_with = Echo.options(name="finished").as_actor().get(timeout=60)
    done_with.stop().get(timeout=30)
    running = Echo.options(name="working").as_actor().get(timeout=60)
    tmux = Tmux()
    try:
        pane = tmux.start([sys.executable, "-m", "zmesh", "top", "--agents", agents], 100, 30)
        wait_for(lambda: "+1 history" in tmux.screen(), 30, "the first frame")
        tmux.keys("2")  # the procs pane (once top reads keys: cbreak mode drops earlier ones)

        def folded() -> bool:
            s = tmux.screen()
            # Mesh names may be cut to "finished…" in a narrow column.
            return "working" in s and "history rows folded" in s and "finished" not in s

        wait_for(folded, 30, "the stopped mesh folded into the history count")
        tmux.press("H", lambda s: "finished" in s, 10, "H to show the history row")
        tmux.press("H", lambda s: "finished" not in s, 10, "H to fold it again")
        tmux.quit(pane)
    finally:
        tmux.close()
        running.stop().get(timeout=30)

"""``zmesh top``, ``status`` and ``ps`` against a real mesh under load, as subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

import zmesh
from zmesh import testing
from zmesh.testing import AgentProcess

from _helpers import pid_alive, wait_for, wait_gone

pytestmark = pytest.mark.slow


class Busy(zmesh.Actor):
    def __init__(self) -> None:
        self.n = 0

    @zmesh.endpoint
    async def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n

    @zmesh.endpoint
    def pid(self) -> int:
        return os.getpid()


def zmesh_cmd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zmesh", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def loaded(cluster: list[AgentProcess]) -> Iterator[tuple[str, zmesh.ActorMesh[Busy], list[int]]]:
    """A 2x2 mesh over the two agents, called in a loop from a thread."""
    mesh = Busy.options(procs=2, hosts=2).as_actor().get(timeout=60)
    pids = mesh.pid.call().get(timeout=30).values()
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                mesh.slice(procs=0).incr.call(1).get(timeout=10)
            except zmesh.ZmeshError:
                time.sleep(0.01)  # a rank was killed on purpose

    thread = threading.Thread(target=load, name="load", daemon=True)
    thread.start()
    try:
        yield ",".join(a.control for a in cluster), mesh, pids
    finally:
        stop.set()
        thread.join(15)
        mesh.stop().get(timeout=30)


def test_top_once_and_json_show_procs_endpoints_and_rates(
    loaded: tuple[str, zmesh.ActorMesh[Busy], list[int]],
) -> None:
    agents, _mesh, pids = loaded
    done = zmesh_cmd("top", "--agents", agents, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    snap = data["snapshot"]
    assert [a["state"] for a in snap["agents"]] == ["ok", "ok"]
    procs = [p for a in snap["agents"] for p in a["stats"]["procs"]]
    assert sorted(p["pid"] for p in procs) == sorted(pids)
    assert all(p["rss"] > 0 and p["uptime"] > 0 for p in procs)
    rows = {(e["actor"], e["endpoint"]): e for e in data["endpoints"]}
    total = data["endpoints"][0]
    assert total["actor"] == "Total" and total["calls"] > 0
    incr = next(e for k, e in rows.items() if k[1] == "incr")
    assert incr["calls"] > 0 and incr["ranks"] == 4 and incr["p50"] > 0
    assert any(k[1] == "pid" for k in rows)

    done = zmesh_cmd("top", "--agents", agents, "--once", "--width", "120")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "agents 2/2" in out and "procs 4/4" in out
    for pid in pids:
        assert str(pid) in out
    total_line = next(ln for ln in out.splitlines() if ln.startswith("Total"))
    assert float(total_line.split()[1].rstrip("k")) > 0
    assert any("incr" in ln and "Total" not in ln for ln in out.splitlines())

    done = zmesh_cmd("ps", "--agents", agents, "--json")
    assert done.returncode == 0, done.stderr
    assert sorted(p["pid"] for p in json.loads(done.stdout)) == sorted(pids)


def test_status_exits_1_after_a_proc_is_killed(
    loaded: tuple[str, zmesh.ActorMesh[Busy], list[int]],
) -> None:
    agents, _mesh, pids = loaded
    done = zmesh_cmd("status", "--agents", agents)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "healthy" in done.stdout
    os.kill(pids[3], signal.SIGKILL)  # a proc of ours, by pid
    wait_gone([pids[3]], 10, "the killed proc")
    done = wait_for(
        lambda: (d := zmesh_cmd("status", "--agents", agents)).returncode == 1 and d,
        20,
        "zmesh status to report the killed rank",
    )
    assert "Failed" in done.stdout and "killed by SIGKILL" in done.stdout


def test_no_agents_is_a_usage_error() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ZMESH_AGENTS"}
    env["ZMESH_RUNTIME_DIR"] = tempfile.mkdtemp()  # none of our agents runs there
    done = subprocess.run(
        [sys.executable, "-m", "zmesh", "top", "--once"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert done.returncode == 2 and "no agents" in done.stderr


def test_ps_finds_this_users_own_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = tempfile.mkdtemp()
    monkeypatch.setenv("ZMESH_RUNTIME_DIR", runtime)  # for the agent and for ps
    monkeypatch.delenv("ZMESH_AGENTS", raising=False)
    agent = testing.start_agent("mine")
    try:
        assert agent.control == f"ipc://{runtime}/a{agent.pid}/c"
        done = subprocess.run(
            [sys.executable, "-m", "zmesh", "status", "--timeout", "10"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "agents 1/1 ok" in done.stdout
    finally:
        testing.stop_agent(agent)
        shutil.rmtree(runtime, ignore_errors=True)


# ---------------------------------------------------------------- a real terminal


class Tmux:
    """A private tmux server (its own socket), killed by pid at the end."""

    def __init__(self) -> None:
        self.sock = f"zmesh-test-{uuid.uuid4().hex[:8]}"
        self.server_pid = 0

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-L", self.sock, "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            timeout=10,
        )

    def start(self, cmd: list[str], width: int, height: int) -> int:
        done = self(
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            str(width),
            "-y",
            str(height),
            "-P",
            "-F",
            "#{pid} #{pane_pid}",
            *cmd,
        )
        assert done.returncode == 0, done.stderr
        server, pane = done.stdout.split()
        self.server_pid = int(server)
        return int(pane)

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "top").stdout

    def keys(self, *keys: str) -> None:
        assert self("send-keys", "-t", "top", *keys).returncode == 0

    def press(self, key: str, shows: Callable[[str], bool], timeout: float, what: str) -> None:
        """Send ``key``, then wait until ``shows(screen)`` holds (or fail with ``what``)."""
        self.keys(key)
        wait_for(lambda: shows(self.screen()), timeout, what)

    def quit(self, pane: int) -> None:
        """Press q and wait until top (the pane's process) has exited."""
        self.keys("q")
        wait_gone([pane], 10, "zmesh top after q")

    def close(self) -> None:
        self("kill-server")
        if self.server_pid and pid_alive(self.server_pid):
            os.kill(self.server_pid, signal.SIGKILL)
        if self.server_pid:
            wait_gone([self.server_pid], 10, "the tmux server")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_interactive_keys_in_a_real_terminal(
    loaded: tuple[str, zmesh.ActorMesh[Busy], list[int]],
) -> None:
    agents, _mesh, _pids = loaded
    tmux = Tmux()
    try:
        pane = tmux.start([sys.executable, "-m", "zmesh", "top", "--agents", agents], 100, 30)
        wait_for(lambda: "procs 4/4" in tmux.screen(), 30, "the first frame")
        wait_for(lambda: "incr" in tmux.screen(), 10, "the incr endpoint")

        tmux.keys("/")
        wait_for(lambda: "filter: " in tmux.screen(), 10, "the filter prompt")
        tmux.keys("-l", "nosuchthing")
        tmux.keys("Enter")

        def filtered() -> bool:
            s = tmux.screen()
            return "filter: nosuchthing" in s and "incr" not in s

        wait_for(filtered, 10, "the filter to hide every endpoint")
        tmux.keys("Escape")
        wait_for(lambda: "incr" in tmux.screen(), 10, "the filter to be cleared")

        tmux.keys("e")
        wait_for(lambda: "errors-only" in tmux.screen(), 10, "the errors-only view")
        wait_for(lambda: "incr" not in tmux.screen(), 10, "healthy endpoints to be hidden")
        tmux.keys("e")
        wait_for(lambda: "errors-only" not in tmux.screen(), 10, "the full view again")

        tmux.quit(pane)
    finally:
        tmux.close()


class Batched(zmesh.Actor):
    @zmesh.endpoint(batch=8, batch_wait=0.05)
    async def double(self, xs: list[int]) -> list[int]:
        return [2 * x for x in xs]


def test_top_shows_the_batches_and_mean_batch_size_of_a_batched_endpoint(
    cluster: list[AgentProcess],
) -> None:
    agents = ",".join(a.control for a in cluster)
    one = Batched.options().as_actor().get(timeout=60)
    stop = threading.Event()

    def load() -> None:  # 16 single calls at a time: batches of up to 8
        while not stop.is_set():
            futs = [one.double(i) for i in range(16)]
            assert [f.get(timeout=30) for f in futs] == [2 * i for i in range(16)]

    thread = threading.Thread(target=load, name="load", daemon=True)
    thread.start()
    try:

        def reported() -> dict[str, object] | None:
            done = zmesh_cmd("top", "--agents", agents, "--json")
            assert done.returncode == 0, done.stderr
            rows = [e for e in json.loads(done.stdout)["endpoints"] if e["endpoint"] == "double"]
            return rows[0] if rows and rows[0]["mean_batch"] else None

        row = wait_for(reported, 60, "top to report double's batches", interval=0.2)
        assert isinstance(row["batches_total"], int) and row["batches_total"] > 0
        assert isinstance(row["mean_batch"], float) and 1.0 < row["mean_batch"] <= 8.0
        out = zmesh_cmd("top", "--agents", agents, "--once", "--width", "140").stdout
        head = next(ln for ln in out.splitlines() if "endpoint" in ln and "batches" in ln)
        assert head.split()[-2:] == ["batches", "batch"]
        line = next(ln for ln in out.splitlines() if "double" in ln)
        assert int(line.split()[-2]) > 0 and 1.0 <= float(line.split()[-1]) <= 8.0
    finally:
        stop.set()
        thread.join(30)
        one.stop().get(timeout=30)


def test_top_json_with_a_service_running_shows_its_replica_table(
    cluster: list[AgentProcess],
) -> None:
    agents = ",".join(a.control for a in cluster)
    svc = Busy.options(replicas=2, name="jsonsvc").as_service().get(timeout=60)
    try:
        assert svc.incr(1).get(timeout=30) == 1

        def summaries() -> list[dict[str, object]] | None:
            done = zmesh_cmd("top", "--agents", agents, "--json")
            assert done.returncode == 0, done.stderr  # was: bytes is not JSON serializable
            found = [
                s
                for a in json.loads(done.stdout)["snapshot"]["agents"]
                for s in (a["stats"] or {}).get("services", [])
            ]
            return found or None

        found = wait_for(summaries, 30, "the service in top --json")
        table = found[0]["table"]
        assert isinstance(table, list) and len(table) == 2, found
        assert {row["state"] for row in table} == {"HEALTHY"}, table
    finally:
        svc.stop().get(timeout=30)

"""Discovery: the CLI finds this user's agents on this machine with no arguments."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from zmesh._shared import registry

from _helpers import end_child, own_runtime_dir, wait_for

SCRIPT = textwrap.dedent(
    """
    import sys
    import zmesh

    class Sleeper(zmesh.Actor):
        @zmesh.endpoint
        def ping(self) -> int:
            print("ping from the actor", flush=True)
            return 1

    if __name__ == "__main__":
        mesh = Sleeper.options(procs=2, name="sleepy").as_actor().get(timeout=60)
        mesh.ping.call().get(timeout=30)
        print("READY", flush=True)
        sys.stdin.read()  # until the test closes our stdin
    """
)


@pytest.fixture
def runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A runtime directory of this test's own (short: sockets go in it)."""
    monkeypatch.setenv("ZMESH_FORWARD_LOGS", "0")  # the script's stdout is its READY line
    with own_runtime_dir(monkeypatch) as path:
        yield path


def zmesh_cmd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zmesh", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def other_script(runtime_dir: str, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """``python long.py &``: a script whose embedded agent runs a 2-proc mesh."""
    script = tmp_path / "long.py"
    script.write_text(SCRIPT)
    p = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "READY"
        yield p
    finally:
        end_child(p, 30)


def test_ps_status_top_find_the_embedded_agent_of_another_script(
    other_script: subprocess.Popen[str],
) -> None:
    entries = registry.live()
    assert len(entries) == 1 and entries[0].owner == other_script.pid
    assert entries[0].address.startswith("ipc://") and entries[0].label == "local"
    ps = zmesh_cmd("ps", "--json")
    assert ps.returncode == 0, ps.stderr
    rows = json.loads(ps.stdout)
    assert sorted((r["mesh"].split("-")[0], r["rank"], r["state"]) for r in rows) == [
        ("sleepy", 0, "Running"),
        ("sleepy", 1, "Running"),
    ]
    status = zmesh_cmd("status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "procs 2/2 running" in status.stdout
    top = zmesh_cmd("top", "--once", "--width", "120")
    assert top.returncode == 0, top.stderr
    assert "agents 1/1" in top.stdout and "sleepy" in top.stdout
    # The script exits: its agent's entry goes with it.
    assert other_script.stdin is not None
    other_script.stdin.close()
    other_script.wait(30)
    wait_for(lambda: not os.listdir(registry.directory()), 30, "the entry to be removed")
    gone = zmesh_cmd("ps")
    assert gone.returncode == 2 and "no agents to watch" in gone.stderr


def test_stale_and_foreign_entries_are_not_read(runtime_dir: str) -> None:
    base = registry.directory()
    assert os.stat(base).st_mode & 0o777 == 0o700
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = registry.Entry(address="ipc:///nowhere/c", pid=dead.pid, label="ghost")
    Path(base, f"{dead.pid}.json").write_bytes(msgspec.json.encode(stale))
    # The pid of a live process that is no agent, with another start time.
    reused = registry.Entry(address="ipc:///nowhere/d", pid=os.getpid(), label="reused", start=1)
    Path(base, f"{os.getpid()}.json").write_bytes(msgspec.json.encode(reused))
    assert registry.live() == []
    assert os.listdir(base) == []  # both removed on the way
    if os.geteuid() != 0:
        return
    # An entry another user owns is never trusted, even one naming a live process.
    mine = registry.Entry(address="ipc:///evil/c", pid=os.getpid(), label="planted")
    planted = Path(base, "1.json")
    planted.write_bytes(msgspec.json.encode(mine))
    os.chown(planted, 65534, 65534)
    assert registry.live() == []
    done = zmesh_cmd("ps")
    assert done.returncode == 2 and "no agents to watch" in done.stderr


def test_another_users_registry_is_not_ours(runtime_dir: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to make a directory of another user")
    # Their runtime directory (what ZMESH_RUNTIME_DIR would be for them): refused whole.
    os.chown(runtime_dir, 65534, 65534)
    try:
        assert registry.live() == []
        done = zmesh_cmd("ps")
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    finally:
        os.chown(runtime_dir, 0, 0)


def test_a_keyed_tcp_cluster_is_found_with_its_keys(runtime_dir: str) -> None:
    p = subprocess.Popen(
        [sys.executable, "-m", "zmesh", "cluster", "--agents", "2", "--tcp", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert p.stdout is not None
        info = json.loads(p.stdout.readline())
        assert len(info["agents"]) == 2 and info["keys"]
        entries = registry.live()
        assert sorted(e.address for e in entries) == sorted(info["agents"])
        assert {e.keys for e in entries} == {info["keys"]}
        top = zmesh_cmd("top", "--json")
        assert top.returncode == 0, top.stderr
        agents = json.loads(top.stdout)["snapshot"]["agents"]
        assert sorted(a["state"] for a in agents) == ["ok", "ok"]
    finally:
        p.send_signal(2)
        end_child(p, 30)

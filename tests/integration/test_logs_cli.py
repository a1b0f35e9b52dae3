"""Actors' output: forwarded to the owner's stdout, and ``zmesh logs`` / ``zmesh stop`` by name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from _helpers import end_child, own_runtime_dir, wait_for

SCRIPT = textwrap.dedent(
    """
    import sys
    import zmesh

    class Talker(zmesh.Actor):
        @zmesh.endpoint
        def say(self, text: str) -> int:
            print(text, flush=True)
            return 1

        @zmesh.endpoint
        def own(self, text: str) -> int:
            import os
            print(f"{text} from {os.getpid()}", flush=True)
            return 1

    if __name__ == "__main__":
        mesh = Talker.options(procs=2, name="talk").as_actor().get(timeout=60)
        print("READY", flush=True)
        for line in sys.stdin:
            verb, _, text = line.strip().partition(" ")
            if verb == "say":
                mesh.say.call(text).get(timeout=30)
            elif verb == "own":
                mesh.own.call(text).get(timeout=30)
            elif verb == "one":
                mesh.slice(procs=1).say.call(text).get(timeout=30)
            print("DONE", flush=True)
    """
)


@pytest.fixture
def runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with own_runtime_dir(monkeypatch, unset=("ZMESH_FORWARD_LOGS",)) as path:
        yield path


class Script:
    """The talker script, driven line by line; what it printed so far."""

    def __init__(self, path: Path, env: dict[str, str]) -> None:
        self.p = subprocess.Popen(
            [sys.executable, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env={**os.environ, **env},
        )  # fmt: skip
        self.out: list[str] = []
        try:
            self.until("READY")
        except BaseException:
            self.close()
            raise

    def until(self, marker: str, timeout: float = 60) -> list[str]:
        assert self.p.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.p.stdout.readline()
            if not line:
                raise AssertionError(f"the script ended before {marker!r}: {self.out}")
            self.out.append(line.rstrip("\n"))
            if marker in line:
                return self.out
        raise AssertionError(f"no {marker!r} within {timeout}s: {self.out}")

    def send(self, line: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def close(self) -> None:
        end_child(self.p, 30)


@pytest.fixture
def script_path(tmp_path: Path) -> Path:
    path = tmp_path / "talker.py"
    path.write_text(SCRIPT)
    return path


def zmesh_cmd(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zmesh", *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **env},
    )  # fmt: skip


def logs_with(mesh: str, text: str, count: int) -> subprocess.CompletedProcess[str] | None:
    """``zmesh logs MESH`` once it shows ``text`` ``count`` times, else None."""
    done = zmesh_cmd("logs", mesh)
    return done if done.stdout.count(text) == count else None


def test_prints_are_forwarded_with_a_prefix_and_deduplicated(
    runtime_dir: str, script_path: Path
) -> None:
    s = Script(script_path, {})
    try:
        s.send("own hello")
        s.until("DONE")
        s.send("say same-everywhere")
        s.until("DONE")
        # The same line from both ranks: once, then the repeat count (after its window).
        s.until("[repeated 1x across ranks]", 30)
        same = [x for x in s.out if "same-everywhere" in x]
        assert len(same) == 2, s.out
        assert same[1].endswith(" local) same-everywhere [repeated 1x across ranks]"), same
        # Distinct lines of both ranks, each prefixed with where it came from.
        own = [x for x in s.out if " hello from " in x]
        assert len(own) == 2, s.out
        assert sorted(x.split(")")[0].split()[1] for x in own) == ["0", "1"], own
        assert all(x.startswith("(talk-") and x.split(")")[0].endswith(" local") for x in own)
    finally:
        s.close()


def test_forwarding_can_be_turned_off(runtime_dir: str, script_path: Path) -> None:
    s = Script(script_path, {"ZMESH_FORWARD_LOGS": "0"})
    try:
        s.send("say quiet-please")
        s.until("DONE")
        entries = os.listdir(os.path.join(runtime_dir, "agents"))
        assert len(entries) == 1
        # The line is in the log (zmesh logs has it) but never on our stdout.
        logs = wait_for(lambda: logs_with("talk", "quiet-please", 2), 30, "the log lines")
        assert logs is not None
        assert "[talk-" in logs.stdout
        s.send("say second")  # a round trip later: anything forwarded would be here
        s.until("DONE")
        assert not any("quiet-please" in x for x in s.out), s.out
    finally:
        s.close()


def test_zmesh_logs_by_name_all_ranks_one_rank_since_and_follow(
    runtime_dir: str, script_path: Path
) -> None:
    s = Script(script_path, {"ZMESH_FORWARD_LOGS": "0"})
    follow = None
    try:
        s.send("own early")
        s.until("DONE")
        every = wait_for(lambda: logs_with("talk", "early from", 2), 30, "both ranks' lines")
        assert every is not None
        mesh = every.stdout.split("]")[0].strip("[").split()[0]
        assert mesh.startswith("talk-")
        lines = [x for x in every.stdout.splitlines() if "early from" in x]
        assert sorted(x.split("]")[0] for x in lines) == [f"[{mesh} 0", f"[{mesh} 1"]
        one = zmesh_cmd("logs", mesh, "1", "--json")  # the full name works too
        assert one.returncode == 0, one.stderr
        data = json.loads(one.stdout)
        assert data["rank"] == 1 and data["path"].endswith(".1.g1.log")
        assert data["text"].count("early from") == 1
        # --since: only what came after; the agent notes sizes every ~100 ms. The
        # window is measured from the late lines plus a margin for the CLI's own
        # start (seconds on a loaded machine), and the early lines are older than
        # any such window by the gap below.
        time.sleep(5.0)
        late_at = time.monotonic()
        s.send("say late")
        s.until("DONE")

        def since_late() -> subprocess.CompletedProcess[str]:
            window = time.monotonic() - late_at + 4.0
            return zmesh_cmd("logs", "talk", "--since", f"{window:.2f}")

        recent = since_late()
        for _ in range(10):  # the size the late lines made is noted within a tick
            if recent.stdout.count("late") == 2:
                break
            recent = since_late()
        assert recent.stdout.count("late") == 2, recent
        assert "early" not in recent.stdout, recent.stdout
        # -f: new output as it comes.
        follow = subprocess.Popen(
            [sys.executable, "-m", "zmesh", "logs", "talk", "0", "-f"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        out = follow.stdout
        assert out is not None
        wait_for(lambda: "late" in out.readline(), 30, "the log so far")
        s.send("say followed")
        s.until("DONE")
        wait_for(lambda: "followed" in out.readline(), 30, "the new line")
        # No such mesh: the live ones are named.
        none = zmesh_cmd("logs", "nosuch")
        assert none.returncode == 2 and "live: talk-" in none.stderr, none.stderr
    finally:
        if follow is not None:
            follow.kill()
            end_child(follow, 10)
        s.close()


def test_zmesh_stop_by_name(runtime_dir: str, script_path: Path, tmp_path: Path) -> None:
    s = Script(script_path, {"ZMESH_FORWARD_LOGS": "0"})
    try:
        ps = json.loads(zmesh_cmd("ps", "--json").stdout)
        control = json.loads(zmesh_cmd("top", "--json").stdout)["snapshot"]["agents"][0]["address"]
        assert len(ps) == 2
        # Not this agent's user here (no registry entry for it): refused.
        other = tempfile.mkdtemp(prefix="zo-", dir="/tmp")
        try:
            refused = zmesh_cmd("stop", "talk", "--agents", control, ZMESH_RUNTIME_DIR=other)
        finally:
            shutil.rmtree(other, ignore_errors=True)
        assert refused.returncode == 1 and "only its owner" in refused.stdout, refused
        done = zmesh_cmd("stop", "talk", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        rows = json.loads(done.stdout)
        assert [r["ok"] for r in rows] == [True] and rows[0]["mesh"].startswith("talk-")
        wait_for(
            lambda: all(
                p["state"] == "Stopped"
                for p in json.loads(zmesh_cmd("ps", "--all", "--json").stdout)
            ),
            30,
            "the ranks to stop",
        )
    finally:
        s.close()


def test_zmesh_logs_of_a_script_that_ended_by_name_and_list(
    runtime_dir: str, script_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ZMESH_LOG_DIR", str(tmp_path / "logs"))
    s = Script(script_path, {"ZMESH_FORWARD_LOGS": "0"})
    try:
        s.send("say said-before-the-end")
        s.until("DONE")
        s.send("one only-rank-one")
        s.until("DONE")
    finally:
        s.close()  # the script ends, and its embedded agent with it
    assert s.p.returncode == 0

    done = zmesh_cmd("logs", "talk")  # was: "no agents to watch" / "no mesh named"
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "has ended" in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    assert sum("said-before-the-end" in ln for ln in lines) == 2, lines
    assert any(ln.startswith("[talk-") and " 1] only-rank-one" in ln for ln in lines), lines
    one = zmesh_cmd("logs", "talk", "0")
    assert one.returncode == 0 and "said-before-the-end" in one.stdout, one.stderr
    assert "only-rank-one" not in one.stdout, one.stdout
    as_json = json.loads(zmesh_cmd("logs", "talk", "1", "--json").stdout)
    assert "only-rank-one" in as_json["text"] and as_json["rank"] == 1, as_json

    listed = zmesh_cmd("logs", "--list")
    assert listed.returncode == 0, listed.stderr
    row = next(ln for ln in listed.stdout.splitlines() if ln.startswith("talk "))
    assert "talk-" in row and " 2 " in row, listed.stdout
    rows = json.loads(zmesh_cmd("logs", "--list", "--json").stdout)
    assert [(r["name"], r["ranks"]) for r in rows] == [("talk", 2)], rows

    none = zmesh_cmd("logs", "nosuch")
    assert none.returncode == 2 and "zmesh logs --list" in none.stderr, none.stderr
    assert len(none.stderr.splitlines()) == 1, none.stderr

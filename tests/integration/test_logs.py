"""Logs are private: 0700 directories of this user only, 0600 files, old runs pruned."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import zmesh
from zmesh._client.control import local as _local
from zmesh._shared import paths as _paths


class Talker(zmesh.Actor):
    @zmesh.endpoint
    def say(self, text: str) -> str:
        print(text, flush=True)
        return text


def _mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("forkserver", ["1", "0"])
def test_logs_are_private_to_their_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forkserver: str
) -> None:
    monkeypatch.delenv("ZMESH_LOG_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("ZMESH_FORKSERVER", forkserver)  # procs' logs opened by either path
    mesh = Talker.options().as_actor().get(timeout=60)
    assert mesh.say.call_one("a secret").get(timeout=10) == "a secret"
    log_path = mesh.state().ranks[0].log_path
    root = tmp_path / "cache" / "zmesh" / "logs"
    run = root / f"local-{os.getpid()}"
    assert Path(log_path).parent == run
    for d in (root, run):
        assert _mode(d) == 0o700 and os.stat(d).st_uid == os.getuid(), d
    for f in (log_path, run / "agent.log"):
        assert _mode(f) == 0o600, f
    zmesh.shutdown()
    assert "a secret" in Path(log_path).read_text()


def test_a_log_directory_open_to_others_or_not_ours_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    monkeypatch.setenv("ZMESH_LOG_DIR", str(shared))
    with pytest.raises(zmesh.SecurityError, match=f"refusing {shared}: group or others"):
        Talker.options().as_actor().get(timeout=60)
    if os.geteuid() == 0:  # a directory someone else made first
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        monkeypatch.setenv("ZMESH_LOG_DIR", str(theirs))
        with pytest.raises(zmesh.SecurityError, match=f"refusing {theirs}: it belongs to uid"):
            _local.agents(1)
        # An agent's own --log-dir must be ours too (its mode is the user's choice).
        done = subprocess.run(
            [sys.executable, "-m", "zmesh", "agent", "--log-dir", str(theirs)],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert done.returncode == 2 and "belongs to uid 65534" in done.stderr, done.stderr


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _fake_run(root: Path, name: str, pid: int, age: float) -> Path:
    d = root / name
    d.mkdir(mode=0o700)
    (d / _paths.RUN_MARKER).write_text(str(pid))
    (d / "x.log").write_text("old\n")
    t = time.time() - age
    os.utime(d, (t, t))
    return d


def test_old_runs_are_pruned_by_count_and_age(tmp_path: Path) -> None:
    root = Path(_paths.private_dir(str(tmp_path / "logs")))
    dead = _dead_pid()
    runs = [_fake_run(root, f"local-{i}", dead, age=3600.0 * (i + 1)) for i in range(60)]
    stale = _fake_run(root, "local-stale", dead, age=8 * 86400.0)
    live = _fake_run(root, "local-live", os.getpid(), age=30 * 86400.0)  # its process runs
    labelled = root / "node1"  # an agent's own --label directory, no marker: never pruned
    labelled.mkdir()
    os.utime(labelled, (0, 0))
    removed = _paths.prune_runs(str(root))
    assert sorted(removed) == sorted(str(d) for d in [*runs[50:], stale])
    assert all(d.exists() for d in [*runs[:50], live, labelled])
    assert not any(d.exists() for d in [*runs[50:], stale])

"""``zmesh up`` with a launcher that hangs or never starts the agent.

Either way it ends with a clear error within its timeout, and leaves no
process behind (a hanging launcher is stopped with everything it started).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _helpers import pid_alive, wait_gone

HANG = """#!/bin/sh
# Never runs its command: hangs, with a child that holds its stdout.
echo $$ >> "{pids}"
sleep 3600 &
echo $! >> "{pids}"
wait
"""

IDLE = """#!/bin/sh
# Says it ran the command, and started nothing.
echo $$ >> "{pids}"
exit 0
"""


@pytest.mark.parametrize(
    ("launcher", "said"),
    [
        (HANG, "the launcher did not copy the keys on h1 within 2s"),
        (IDLE, "no answer within 2.0s from tcp://127.0.0.1:"),
    ],
    ids=["hangs", "never-starts-the-agent"],
)
def test_zmesh_up_ends_with_a_clear_error_and_leaves_nothing(
    tmp_path: Path, launcher: str, said: str
) -> None:
    pids = tmp_path / "pids"
    script = tmp_path / "launch.sh"
    script.write_text(launcher.format(pids=pids))
    script.chmod(0o700)
    hosts = tmp_path / "hosts"
    hosts.write_text("h1 127.0.0.1\n")
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "zmesh", "up", str(hosts), "--launcher", f"{script} {{host}}",
         "--timeout", "2", "--keys", str(tmp_path / "keys"), "--port", "1"],
        capture_output=True, text=True, timeout=60, env={**os.environ},
    )  # fmt: skip
    took = time.monotonic() - t0
    assert done.returncode != 0 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert took < 2 + 15, f"zmesh up took {took:.1f}s with a 2 s timeout"
    started = [int(p) for p in pids.read_text().split()]
    assert started
    wait_gone(started, 5, "the launcher's processes")
    assert not any(pid_alive(p) for p in started)


HANG_ON_H1 = """#!/bin/sh
# Hangs on h1 (with a child that holds its stdout); runs its command elsewhere.
host=$1
shift
if [ "$host" = h1 ]; then
    echo $$ >> "{pids}"
    sleep 3600 &
    echo $! >> "{pids}"
    wait
fi
exec "$@"
"""


def test_zmesh_down_with_a_hanging_launcher_names_the_host_and_goes_on(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = tmp_path / "launch.sh"
    script.write_text(HANG_ON_H1.format(pids=pids))
    script.chmod(0o700)
    hosts = tmp_path / "hosts"
    hosts.write_text("h1 127.0.0.1\nh2 127.0.0.1\n")
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "zmesh", "down", str(hosts), "--launcher", f"{script} {{host}}",
         "--timeout", "2", "--port", "1", "--zmesh", f"{sys.executable} -m zmesh", "--json"],
        capture_output=True, text=True, timeout=60, env={**os.environ},
    )  # fmt: skip
    took = time.monotonic() - t0
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stdout + done.stderr
    rows = json.loads(done.stdout)
    assert [(r["host"], r["ok"]) for r in rows] == [("h1", False), ("h2", False)], rows
    assert "did not stop the agent on h1 within 2s" in rows[0]["error"], rows
    assert "no agent of yours at tcp://127.0.0.1:1" in rows[1]["error"], rows  # it went on
    assert took < 2 + 15, f"zmesh down took {took:.1f}s with a 2 s timeout"
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 2
    wait_gone(started, 5, "the launcher's processes")

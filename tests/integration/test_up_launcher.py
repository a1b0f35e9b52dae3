"""``zmesh up`` with a launcher that hangs or never starts the agent.

Either way it ends with a clear error within its timeout, and leaves no
process behind (a hanging launcher is stopped with everything it started).
"""

from __future__ import annotations

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

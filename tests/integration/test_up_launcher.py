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

from _helpers import pid_alive, wait_for, wait_gone

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


def write_launcher(tmp_path: Path, text: str, hosts: str) -> tuple[Path, Path, Path]:
    """Write the launcher ``text`` (``{pids}`` filled in) and a hostfile: (script, pids, hosts)."""
    pids = tmp_path / "pids"
    script = tmp_path / "launch.sh"
    script.write_text(text.format(pids=pids))
    script.chmod(0o700)
    hostfile = tmp_path / "hosts"
    hostfile.write_text(hosts)
    return script, pids, hostfile


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
    script, pids, hosts = write_launcher(tmp_path, launcher, "h1 127.0.0.1\n")
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
    script, pids, hosts = write_launcher(tmp_path, HANG_ON_H1, "h1 127.0.0.1\nh2 127.0.0.1\n")
    t0 = time.monotonic()  # 5 s: h2's own `zmesh down --local` must start within it
    done = subprocess.run(
        [sys.executable, "-m", "zmesh", "down", str(hosts), "--launcher", f"{script} {{host}}",
         "--timeout", "5", "--port", "1", "--zmesh", f"{sys.executable} -m zmesh", "--json"],
        capture_output=True, text=True, timeout=60, env={**os.environ},
    )  # fmt: skip
    took = time.monotonic() - t0
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stdout + done.stderr
    rows = json.loads(done.stdout)
    assert [(r["host"], r["ok"]) for r in rows] == [("h1", False), ("h2", False)], rows
    assert "did not stop the agent on h1 within 5s" in rows[0]["error"], rows
    assert "no agent of yours at tcp://127.0.0.1:1" in rows[1]["error"], rows  # it went on
    assert took < 5 + 15, f"zmesh down took {took:.1f}s with a 5 s timeout"
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 2
    wait_gone(started, 5, "the launcher's processes")


def _agents_under(path: Path) -> list[int]:
    """Pids of the ``zmesh agent`` processes whose command line names ``path``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "agent" in cmd and any(str(path) in c for c in cmd):
            found.append(int(entry))
    return found


def test_zmesh_up_that_fails_on_one_host_names_the_agents_it_left_running(
    tmp_path: Path,
) -> None:
    # h1 comes up, h2's launcher hangs: up fails naming h2, and says that
    # h1's agent runs and how to stop it (it does not stop it: an agent of
    # an earlier `zmesh up` may be serving there).
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script, pids, hosts = write_launcher(
        tmp_path, HANG_ON_H1.replace("h1", "h2"), "h1 127.0.0.1\nh2 127.0.0.1\n"
    )
    home = tmp_path / "home"
    home.mkdir()
    launch = ["--launcher", f"{script} {{host}}", "--timeout", "2", "--port", str(port),
              "--zmesh", f"{sys.executable} -m zmesh"]  # fmt: skip
    env = {**os.environ, "HOME": str(home)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "zmesh", "up", str(hosts), *launch,
             "--keys", str(tmp_path / "keys")],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert "did not copy the keys on h2 within 2s" in done.stderr, done.stderr
        assert f"zmesh down {hosts}" in done.stderr and "running on h1" in done.stderr, done.stderr
        agents = _agents_under(home)
        assert len(agents) == 1  # h1's: named, not stopped
        # h2 fixed, up again: h1's running agent is used as it is.
        script.write_text(HANG_ON_H1.replace("h1", "nobody").format(pids=pids))
        again = subprocess.run(
            [sys.executable, "-m", "zmesh", "up", str(hosts), *launch,
             "--keys", str(tmp_path / "keys"), "--json"],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["agents"] == [f"tcp://127.0.0.1:{port}"] * 2
        wait_for(lambda: _agents_under(home) == agents, 10, "only h1's first agent")
    finally:
        down = subprocess.run(
            # h2's launcher hangs for its 2 s; h1's own `zmesh down --local` gets its time.
            [sys.executable, "-m", "zmesh", "down", str(hosts), *launch, "--timeout", "30",
             "--json"],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        wait_gone(_agents_under(home), 15, "h1's agent")
    assert json.loads(down.stdout)[0]["ok"], down.stdout

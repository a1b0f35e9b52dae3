"""A proc whose actor's ``__init__`` runs shows as Initializing (``zmesh ps``, ``get``, top).

Its agent says Running once the proc is up; the proc's statistics say an
``__init__`` runs (``ProcStatistics.initializing``), sent as it starts and
as it ends, and every view shows Initializing meanwhile.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import zmesh

from _helpers import wait_for


class SlowInit(zmesh.Actor):
    def __init__(self, gate: str) -> None:
        # Held until the test opens the gate (a file), at most 60 s.
        deadline = time.monotonic() + 60
        while not Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    @zmesh.endpoint
    async def ping(self) -> str:
        return "pong"


def _zmesh(*args: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "zmesh", *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _ps_states(mesh: str) -> list[str]:
    # ``as_actor`` starts the embedded agent in the background: until it has
    # registered, ``zmesh ps`` finds no agent at all, which here means "not yet".
    done = subprocess.run(
        [sys.executable, "-m", "zmesh", "ps", "--json"], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0 and "no agents" in done.stderr:
        return []
    assert done.returncode == 0, done.stderr
    return [p["state"] for p in json.loads(done.stdout) if p["mesh"] == mesh]


def test_ps_and_get_show_initializing_while_init_runs(tmp_path: Path) -> None:
    gate = tmp_path / "open"
    mesh = SlowInit.options(procs=2, name="slowinit").as_actor(str(gate))
    try:
        name = mesh.proc_mesh  # the procs' mesh, as ps names it
        wait_for(
            lambda: _ps_states(name) == ["Initializing", "Initializing"], 30,
            "ps to show both procs Initializing",
        )  # fmt: skip
        got = _zmesh("get", name, "--json")
        assert [r["status"] for r in got["ranks"]] == ["Initializing", "Initializing"], got
        top = subprocess.run(
            [sys.executable, "-m", "zmesh", "top", "--once", "--width", "160"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert "Initializing" in top.stdout, top.stdout
        gate.touch()
        mesh.initialized.get(timeout=60)
        assert mesh.ping.call().get(timeout=30).values() == ["pong", "pong"]
        wait_for(lambda: _ps_states(name) == ["Running", "Running"], 30, "ps to show Running")
    finally:
        gate.touch()
        mesh.stop().get(timeout=30)


SLOW_SPAWN = """
import time
import zmesh

class Slow(zmesh.Actor):
    def __init__(self) -> None:
        time.sleep(2.5)

    @zmesh.endpoint
    async def ping(self) -> str:
        return "pong"

mesh = Slow.options(procs=2, name="slowspawn").as_actor()
print("answer", mesh.ping.call().get(timeout=60).values(), flush=True)
"""


def _run_on_a_terminal(script: Path) -> str:
    """Run ``script`` with its stdout on a pseudo-terminal; all it wrote there."""
    main, sub = pty.openpty()
    p = subprocess.Popen(
        [sys.executable, str(script)], stdout=sub, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    os.close(sub)
    out = b""
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(main, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif p.poll() is not None:
                break
    finally:
        os.close(main)
        if p.poll() is None:
            p.kill()
        _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    return out.decode(errors="replace")


def test_a_slow_spawn_shows_its_progress_on_a_terminal_only(tmp_path: Path) -> None:
    script = tmp_path / "slow_spawn.py"
    script.write_text(SLOW_SPAWN)
    shown = _run_on_a_terminal(script)
    assert "spawning slowspawn-" in shown and "actors initializing" in shown, shown
    assert "answer ['pong', 'pong']" in shown
    piped = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=90
    )  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == "answer ['pong', 'pong']\n"

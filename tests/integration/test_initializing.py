"""A proc whose actor's ``__init__`` runs shows as Initializing (``zmesh ps``, ``get``, top).

Its agent says Running once the proc is up; the proc's statistics say an
``__init__`` runs (``ProcStatistics.initializing``), sent as it starts and
as it ends, and every view shows Initializing meanwhile.
"""

from __future__ import annotations

import json
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
    return [p["state"] for p in _zmesh("ps", "--json") if p["mesh"] == mesh]


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

"""The agent's proc table while forks are in flight (``zmesh._host.agent.proctable``).

Spawns are pipelined: a rank's process exists only once the forkserver's
reply arrives, and its hello may come first, or its mesh may be stopped
meanwhile. The table is driven without sockets; the launches it asks for
are held, and real processes stand in for the forked procs.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from zmesh._host.agent import updates
from zmesh._host.agent.proctable import ProcTable
from zmesh._host.agent.spawner import Launch
from zmesh._shared.state import Rank, Status
from zmesh._wire import messages as w

pytestmark = pytest.mark.anyio


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])


async def _until(cond: object, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():  # type: ignore[operator]
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_a_hello_before_the_fork_reply_and_a_stop_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, Status]] = []

    def on_transition(mesh: object, rank: int, state: Rank) -> None:
        seen.append((rank, state.status))

    table = ProcTable("h", str(tmp_path), "epoch", on_transition)
    table.configure("ipc:///nowhere", f"ipc://{tmp_path}/p", "")
    launches: list[Launch] = []
    monkeypatch.setattr(table.spawner, "start", launches.append)  # the forks are in flight
    mesh = updates.create(table, "m", w.ProcSpec(owner="o", ranks=[0, 1], dims={"procs": 2}))
    assert [launch.key for launch in launches] == [("m", 0, 1), ("m", 1, 1)]
    assert seen == [] and table.alive()  # nothing to report yet, but not idle

    first, second = _sleeper(), _sleeper()
    try:
        # Rank 0 says hello before the forkserver's reply: kept, not lost.
        table.hello(w.ProcHello("m", 0, 1, "ipc:///a0", first.pid))
        table._started(launches[0], first)
        assert mesh.view.ranks[0].status is Status.RUNNING
        assert mesh.view.ranks[0].addr == "ipc:///a0" and mesh.view.ranks[0].pid == first.pid
        # The mesh is stopped while rank 1 is still being forked: once it
        # exists it is stopped too, and both end Stopped.
        table.stop(mesh)
        table._started(launches[1], second)
        await _until(lambda: not table.alive())
        assert {r.status for r in mesh.view.ranks.values()} == {Status.STOPPED}
        assert (1, Status.INITIALIZING) in seen and (1, Status.STOPPING) in seen
    finally:
        for p in (first, second):
            p.kill()
            p.wait()

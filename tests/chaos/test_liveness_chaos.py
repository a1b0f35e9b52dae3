"""Liveness under stress: busy is not dead, and a restarted agent is rejoined.

A process that holds the GIL in one long C call cannot run Python, so its
application heartbeats stop; it is busy, not dead, and must not be killed.
Real deaths (exit, signal, SIGSTOP, a lost agent) must still be seen fast.
Every test uses real processes, real signals and real agents, and prints
what it measured as ``LATENCY ...`` (``pytest -s`` shows them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import zmesh
from zmesh._client.calls import runtime as _runtime
from zmesh._client.control import local as _local
from zmesh._shared.state import Status
from zmesh._wire import messages as w
from zmesh.testing import AgentProcess, local_cluster, stop_agent

from _actors import Ranked
from _helpers import latency, pid_alive, read_line, status_of, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.anyio]

# Longer than the grace and heartbeat timeouts these holds used to be taken for
# death by (3 s for owners, 2 s for procs), with a margin for timer slack:
# (aimed at, at least).
CLIENT_HOLD = (4.5, 3.4)
PROC_HOLD = (3.5, 2.3)


class Hog(Ranked):
    @zmesh.endpoint
    def hold_gil(self, seconds: float, least: float) -> float:
        """One C call that never lets go of the GIL: no heartbeat can be sent."""
        return hold_gil(seconds, least)

    @zmesh.endpoint
    async def hold_loop(self, seconds: float, least: float) -> float:
        """The same on the event loop itself (an async endpoint that computes)."""
        return hold_gil(seconds, least)

    @zmesh.endpoint
    async def block_loop(self, seconds: float) -> None:
        """A hung loop: blocked, and using no CPU."""
        time.sleep(seconds)


# ------------------------------------------------------------ helpers


def hold_gil(seconds: float, least: float) -> float:
    """Hold the GIL in one C call for about ``seconds``, and at least ``least``.

    The call is sized from a quick measurement; on a machine whose load
    changes, a call that came out shorter than ``least`` is made again,
    larger. Returns how long the (last) call held the GIL.
    """
    rate = 2_000_000 / min(_time_sum(2_000_000) for _ in range(3))  # per second, now
    for _ in range(5):
        took = _time_sum(int(rate * seconds))
        if took >= least:
            return took
        rate = int(rate * seconds) / took
    return took


def _time_sum(n: int) -> float:
    t0 = time.perf_counter()
    sum(range(n))
    return time.perf_counter() - t0


async def collect(mesh: zmesh.ActorMesh[Any], into: list[zmesh.SupervisionEvent]) -> None:
    async for ev in mesh.supervision_events():
        into.append(ev)


async def agent_view(mesh: zmesh.ActorMesh[Any]) -> w.MeshReport:
    """The mesh as its agent sees it now (a GetState round trip, not the client's view)."""
    rt, _ = _runtime.current()
    (conn,) = rt.controller.agents.values()
    reply = await conn.request(lambda i: w.GetState(i, mesh.proc_mesh))
    (state,) = reply.meshes
    return state


# ------------------------------------------------------- busy, not dead


async def test_client_holding_the_gil_keeps_its_meshes() -> None:
    """An owner in one long C call sends no heartbeat; its agent must not stop its meshes."""
    mesh = await Hog.options(procs=1).as_actor()
    pid = await mesh.pid.call_one()
    events: list[zmesh.SupervisionEvent] = []
    watcher = asyncio.ensure_future(collect(mesh, events))
    held = hold_gil(*CLIENT_HOLD)  # the owner heartbeat thread cannot run meanwhile
    latency("client GIL hold (meshes kept)", held)
    assert held >= CLIENT_HOLD[1], f"the hold was too short to mean anything ({held:.1f}s)"
    assert await mesh.pid.options(timeout=10).call_one() == pid
    state = await agent_view(mesh)
    assert state.status == "Running", state
    assert pid_alive(pid)
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    assert events == []


@pytest.mark.parametrize("endpoint", ["hold_gil", "hold_loop"])
async def test_endpoint_holding_the_gil_is_busy_not_hung(endpoint: str) -> None:
    """A proc computing in one C call (in a sync endpoint's thread, or on its loop)
    misses its heartbeats while it burns CPU: it is busy, and its call returns."""
    mesh = await Hog.options(procs=1).as_actor()
    pid = await mesh.pid.call_one()
    events: list[zmesh.SupervisionEvent] = []
    watcher = asyncio.ensure_future(collect(mesh, events))
    held = await getattr(mesh, endpoint).options(timeout=120).call_one(*PROC_HOLD)
    latency(f"proc GIL hold in {endpoint} (not killed)", held)
    assert held >= PROC_HOLD[1], f"the hold was too short to mean anything ({held:.1f}s)"
    assert await mesh.pid.options(timeout=10).call_one() == pid
    assert (await agent_view(mesh)).status == "Running"
    assert status_of(mesh, 0) is Status.RUNNING
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    assert events == []


async def test_loop_blocked_without_cpu_is_hung(monkeypatch: pytest.MonkeyPatch) -> None:
    """Silent past the hang timeout and using no CPU: that one is hung (Timeout, killed)."""
    monkeypatch.setenv("ZMESH_PROC_HANG_TIMEOUT", "1.5")  # read by the agent started next
    with local_cluster(1):
        mesh = await Hog.options(procs=2).as_actor()
        victim = mesh.slice(procs=0)
        pid = await victim.pid.call_one()
        t0 = time.monotonic()
        with pytest.raises(zmesh.SupervisionError) as info:
            await victim.block_loop.options(timeout=60).call_one(60.0)
        took = time.monotonic() - t0
        latency("loop blocked without CPU -> Timeout (hang timeout 1.5 s)", took)
        assert 1.0 < took < 6.0, took
        assert status_of(mesh, 0) is Status.TIMEOUT
        assert "no heartbeat" in info.value.reason and "CPU" in info.value.reason
        await wait_until(lambda: not pid_alive(pid), 5.0, "the hung proc is killed")
        assert await mesh.slice(procs=1).ping.options(timeout=10).call_one() == 1


async def test_sigstop_is_timeout_fast() -> None:
    """A stopped proc is not busy: the agent sees state T and says Timeout at once."""
    mesh = await Hog.options(procs=1).as_actor()
    pid = await mesh.pid.call_one()
    os.kill(pid, signal.SIGSTOP)
    try:
        took = await wait_until(
            lambda: status_of(mesh, 0) is Status.TIMEOUT, 2.0, "SIGSTOPped rank is Timeout"
        )
        latency("proc SIGSTOP -> Timeout", took)
        assert took < 1.0, f"SIGSTOP took {took:.2f}s to be noticed"
        assert "stopped" in mesh.state().ranks[0].reason
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    await wait_until(lambda: not pid_alive(pid), 5.0, "the stopped proc is killed")


# ----------------------------------------------------------- owners

OWNER_SCRIPT = """
import json, os, sys, time
import zmesh

class Pid(zmesh.Actor):
    @zmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

if __name__ == "__main__":
    mesh = Pid.options(procs=2).as_actor().get(timeout=60)
    print(json.dumps(mesh.pid.call().get(timeout=30).values()), flush=True)
    time.sleep(120)
"""


def test_killed_local_owner_loses_its_procs_at_once(tmp_path: Path) -> None:
    """An owner on the agent's machine is watched by pidfd: its death is seen at once,
    not after the (generous) heartbeat grace."""
    with local_cluster(1) as agents:
        script = tmp_path / "owner.py"
        script.write_text(OWNER_SCRIPT)
        env = dict(os.environ, ZMESH_AGENTS=agents[0].control)
        env.pop("ZMESH_OWNER_GRACE", None)
        popen = subprocess.Popen(
            [sys.executable, str(script)], env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        try:
            pids = json.loads(read_line(popen, 60))
            assert len(pids) == 2 and all(pid_alive(p) for p in pids)
            killed = time.monotonic()
            os.kill(popen.pid, signal.SIGKILL)
            popen.wait(10)
            deadline = killed + 1.5
            while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.01)
            took = time.monotonic() - killed
            latency("local owner kill -9 -> its procs gone", took)
            assert not any(pid_alive(p) for p in pids), f"procs alive {took:.1f}s after"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(popen.pid, signal.SIGKILL)
            popen.communicate(timeout=10)


# ------------------------------------------------------ agent restart


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _agent_at(addr: str, label: str, log_dir: Path) -> AgentProcess:
    """An agent bound to exactly ``addr`` (so that it can be restarted there).

    Keyless loopback TCP (``--insecure``): what is tested is the restart on
    one port; the security tests cover keys.
    """
    log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_path = str(log_dir / "agent.log")
    cmd = [sys.executable, "-m", "zmesh", "agent", "--bind", addr, "--label", label]
    cmd += ["--log-dir", str(log_dir), "--insecure"]
    with open(log_path, "ab") as err:
        popen = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
            start_new_session=True,
        )  # fmt: skip
    info = _local.await_ready(popen, log_path)
    return AgentProcess(label, info.control, info.stream, popen.pid, str(log_dir), popen)


@contextlib.contextmanager
def _phoenix(tmp_path: Path) -> Iterator[tuple[str, list[AgentProcess]]]:
    """An agent on a port of its own, connected to: (its address, the agents started there).

    A test restarts it at the same address by appending the new one; all
    are stopped after the block.
    """
    addr = f"tcp://127.0.0.1:{_free_port()}"
    started: list[AgentProcess] = []
    try:
        started.append(_agent_at(addr, "phoenix", tmp_path / "first"))
        zmesh.connect([addr])
        yield addr, started
    finally:
        zmesh.shutdown()
        _local.configure(None)
        for a in started:
            stop_agent(a)


async def test_agent_restarted_on_the_same_port_is_rejoined(tmp_path: Path) -> None:
    with _phoenix(tmp_path) as (addr, started):
        mesh = await Hog.options(procs=2).as_actor()
        pids = (await mesh.pid.call()).values()
        rt, _ = _runtime.current()
        conn = rt.controller.agents[addr]
        first_epoch = conn.epoch

        started[0].kill()  # kill -9: its procs die with it (PR_SET_PDEATHSIG)
        started[0].popen.wait(10)
        await wait_until(lambda: not any(pid_alive(p) for p in pids), 5.0, "procs gone")
        started.append(_agent_at(addr, "phoenix", tmp_path / "second"))
        restarted = time.monotonic()

        took = await wait_until(
            lambda: all(status_of(mesh, r) is Status.FAILED for r in (0, 1)),
            5.0,
            "old ranks Failed after the agent restarted",
        )
        latency("agent restart -> old ranks Failed", took)
        assert conn.epoch != first_epoch
        assert all("agent restarted" in mesh.state().ranks[r].reason for r in (0, 1)), (
            mesh.state().ranks
        )
        with pytest.raises(zmesh.SupervisionError, match="agent restarted"):
            await mesh.slice(procs=0).ping.options(timeout=5).call_one()

        fresh = await asyncio.wait_for(Hog.options(procs=2).as_actor(), 10.0)
        latency("agent restart -> a new mesh answers", time.monotonic() - restarted)
        assert (await fresh.ping.options(timeout=5).call()).values() == [0, 1]
        assert fresh.state().status is Status.RUNNING


async def test_spawn_right_after_an_agent_restart_works(tmp_path: Path) -> None:
    """A spawn sent before the client noticed the restart still lands on the new agent."""
    with _phoenix(tmp_path) as (addr, started):
        old = await Hog.options(procs=1).as_actor()
        await old.ping.call_one()
        started[0].kill()
        started[0].popen.wait(10)
        started.append(_agent_at(addr, "phoenix", tmp_path / "second"))
        t0 = time.monotonic()
        fresh = await asyncio.wait_for(Hog.options(procs=1).as_actor(), 10.0)
        latency("spawn at once after an agent restart", time.monotonic() - t0)
        assert await fresh.ping.options(timeout=5).call_one() == 0
        await wait_until(lambda: status_of(old, 0) is Status.FAILED, 5.0, "old rank Failed")
        assert "agent restarted" in old.state().ranks[0].reason

"""Everything a proc starts is stopped with it.

A proc's children and their children (a ``start_new_session`` child, a
double-forked daemon, a child with an empty environment) are real processes
here, checked by pid. They must be gone after ``mesh.stop()``, after the proc
is SIGKILLed, after the agent shuts down (SIGTERM) and after the agent itself
is SIGKILLed; and they must live on while their proc lives.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

import zmesh
from zmesh.testing import AgentProcess, local_cluster

from _helpers import live_processes, pid_alive, wait_for, wait_gone


class Spawner(zmesh.Actor):
    """Starts processes that outlive the call that started them."""

    def __init__(self) -> None:
        self.children: list[subprocess.Popen[Any]] = []

    @zmesh.endpoint
    def child(self) -> int:
        """A child in a session of its own (not in the proc's process group)."""
        p = subprocess.Popen(["sleep", "600"], start_new_session=True)
        self.children.append(p)
        return p.pid

    @zmesh.endpoint
    def bare_child(self) -> int:
        """A child with an empty environment: nothing in it says whose it is."""
        p = subprocess.Popen(["/bin/sleep", "600"], env={}, start_new_session=True)
        self.children.append(p)
        return p.pid

    @zmesh.endpoint
    def daemon(self) -> int:
        """A double-forked daemon: its parent exits at once, so it is an orphan."""
        out = subprocess.run(
            ["sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"],
            capture_output=True, text=True, start_new_session=True, check=True,
        )  # fmt: skip
        return int(out.stdout)

    @zmesh.endpoint
    def tree(self) -> list[int]:
        """A child with a child of its own, three levels down from the proc."""
        out = subprocess.Popen(
            ["sh", "-c", "sleep 600 & echo $!; wait"],
            stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        assert out.stdout is not None
        grandchild = int(out.stdout.readline())
        self.children.append(out)
        return [out.pid, grandchild]

    @zmesh.endpoint
    def storm(self) -> int:
        """A child that keeps starting daemons (each orphaned at once) and children."""
        script = "while :; do sleep 600 & (sleep 600 &) ; sleep 0.005; done"
        p = subprocess.Popen(["sh", "-c", script], start_new_session=True)
        self.children.append(p)
        return p.pid

    @zmesh.endpoint
    def pid(self) -> int:
        return os.getpid()


def _start_all(mesh: zmesh.ActorMesh[Spawner], bare: bool = True) -> list[int]:
    pids = [mesh.child.call_one().get(timeout=10), mesh.daemon.call_one().get(timeout=10)]
    pids += mesh.tree.call_one().get(timeout=10)
    if bare:
        pids.append(mesh.bare_child.call_one().get(timeout=10))
    assert all(pid_alive(p) for p in pids)
    return pids


def _kill(pids: list[int]) -> None:
    """Clean up after a failed test: only these pids, which the test started."""
    for p in pids:
        if pid_alive(p):
            os.kill(p, signal.SIGKILL)


@pytest.fixture
def agent() -> Iterator[AgentProcess]:
    with local_cluster(1) as agents:
        yield agents[0]


def test_descendants_live_while_their_proc_lives(agent: AgentProcess) -> None:
    mesh = Spawner.options().as_actor().get(timeout=60)
    pids = _start_all(mesh)
    try:
        time.sleep(1.0)  # the agent looks for orphans every 100 ms: give it ten looks
        assert all(pid_alive(p) for p in pids), [p for p in pids if not pid_alive(p)]
        mesh.stop().get(timeout=10)
        wait_gone(pids, 5, "the stopped proc's descendants")
    finally:
        _kill(pids)


def test_descendants_go_with_a_proc_that_is_sigkilled(agent: AgentProcess) -> None:
    mesh = Spawner.options().as_actor().get(timeout=60)
    pids = _start_all(mesh)
    try:
        os.kill(mesh.pid.call_one().get(timeout=10), signal.SIGKILL)
        wait_gone(pids, 5, "the killed proc's descendants")
        with pytest.raises(zmesh.SupervisionError):
            mesh.pid.call_one().get(timeout=10)
    finally:
        _kill(pids)
        mesh.stop().get(timeout=10)


def test_descendants_go_when_the_agent_shuts_down(agent: AgentProcess) -> None:
    mesh = Spawner.options(procs=2).as_actor().get(timeout=60)
    pids = _start_all(mesh.slice(procs=0)) + _start_all(mesh.slice(procs=1))
    try:
        agent.kill(signal.SIGTERM)
        agent.popen.wait(timeout=15)
        wait_gone(pids, 5, "descendants after the agent's shutdown")
    finally:
        _kill(pids)


def test_descendants_go_when_the_agent_is_sigkilled(agent: AgentProcess) -> None:
    mesh = Spawner.options(procs=2).as_actor().get(timeout=60)
    # A child that empties its environment is untraceable once the agent is
    # gone (see docs/architecture.md): the others must all go.
    pids = _start_all(mesh.slice(procs=0), bare=False) + _start_all(mesh.slice(procs=1), bare=False)
    procs = mesh.pid.call().get(timeout=10).values()
    try:
        agent.kill(signal.SIGKILL)
        agent.popen.wait(timeout=15)
        wait_gone(procs, 5, "the procs of the killed agent")
        wait_gone(pids, 5, "descendants after the agent was SIGKILLed")
    finally:
        _kill(pids)


def test_nothing_of_a_stopped_mesh_is_left_after_churn(agent: AgentProcess) -> None:
    # Several meshes, stopped in turn: each one's descendants go, the others' stay.
    meshes = [Spawner.options().as_actor().get(timeout=60) for _ in range(3)]
    started = [_start_all(m) for m in meshes]
    try:
        for i, m in enumerate(meshes):
            m.stop().get(timeout=10)
            wait_gone(started[i], 5, f"mesh {i}'s descendants")
            later = [p for ps in started[i + 1 :] for p in ps]
            wait_for(partial(all_alive, later), 1, "the others to stay")
    finally:
        _kill([p for ps in started for p in ps])


@pytest.mark.stress
@pytest.mark.parametrize("how", ["stop", "kill-proc", "kill-agent"])
def test_a_forking_storm_is_stopped_whole(how: str) -> None:
    with local_cluster(1) as agents:
        agent = agents[0]
        mesh = Spawner.options().as_actor().get(timeout=60)
        storm = mesh.storm.call_one().get(timeout=10)
        proc = mesh.pid.call_one().get(timeout=10)
        epoch = _epoch_of_proc(proc)
        wait_for(lambda: len(_with_epoch(epoch)) > 100, 20, "the storm to grow")
        if how == "stop":
            mesh.stop().get(timeout=10)
        elif how == "kill-proc":
            os.kill(proc, signal.SIGKILL)
        else:
            agent.kill(signal.SIGKILL)
            agent.popen.wait(timeout=15)
        try:
            wait_for(lambda: not _with_epoch(epoch), 10, "every process of the storm to go")
        finally:
            _kill(sorted(_with_epoch(epoch)))
        assert not pid_alive(storm)


def all_alive(pids: list[int]) -> bool:
    return all(pid_alive(p) for p in pids)


def _epoch_of_proc(pid: int) -> str:
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
    return env[b"ZMESH_AGENT_EPOCH"].decode()


def _with_epoch(epoch: str) -> set[int]:
    """Live ``sh`` and ``sleep`` processes whose environment carries ``epoch``."""
    found = live_processes(f"ZMESH_AGENT_EPOCH={epoch}")
    return {p.pid for p in found if p.comm in (b"sleep", b"sh")}

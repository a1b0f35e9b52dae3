"""kill -9 inside the forkserver's fork tree, mid-burst (``_host.agent.forking.fork_tree``).

A burst of procs is forked as a doubling tree: the forkserver forks a few,
and each of those forks part of the burst before it becomes its own proc.
Killing any part of it half-way must cost no hang and no leftover: the
spawn either completes or fails with ``SpawnError``, the agent keeps
serving, and when the mesh is stopped not one process of the burst is
left (the session's end check holds every test to that too).

A fork of the tree still forking is the agent's child named ``zmesh-fork``
(the forkserver's name, until it becomes ``zmesh-proc``) other than the
forkserver itself: the test watches ``/proc`` for one and kills it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

import zmesh
from zmesh import testing

from _helpers import default_agent, wait_for, wait_gone

pytestmark = [pytest.mark.chaos, pytest.mark.stress, pytest.mark.slow]


class Probe(zmesh.Actor):
    @zmesh.endpoint
    def pid(self) -> int:
        return os.getpid()


@pytest.fixture
def agent(monkeypatch: pytest.MonkeyPatch) -> Iterator[testing.AgentProcess]:
    with default_agent(monkeypatch, "fork-tree") as a:
        yield a


def _children(pid: int) -> dict[int, str]:
    """The children of ``pid``, with their names.

    Read from ``/proc/PID/task/*/children`` (a fraction of a millisecond, so
    a tree a few tens of milliseconds long is seen mid-burst), else from
    every process's ``stat``.
    """
    try:
        kids: set[int] = set()
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids.update(int(k) for k in f.read().split())
    except OSError:
        kids = {p for p in map(int, filter(str.isdigit, os.listdir("/proc"))) if _ppid(p) == pid}
    out = {}
    for kid in kids:
        try:
            with open(f"/proc/{kid}/comm") as f:
                out[kid] = f.read().strip()
        except OSError:
            continue  # gone meanwhile
    return out


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except OSError:
        return 0


def _forkserver(agent: testing.AgentProcess) -> int:
    def find() -> int:
        return next((p for p, n in _children(agent.pid).items() if n == "zmesh-fork"), 0)

    return wait_for(find, 10, "the agent's forkserver")


def _kill_mid_burst(agent: testing.AgentProcess, fork: int, which: str, procs: int) -> bool:
    """Spawn ``procs`` and kill -9 ``which`` ("node": a fork of the tree still
    forking; "forkserver") while the tree forks; whether it was caught mid-burst.

    Either way the spawn must end typed and leave nothing once stopped.
    """
    before = set(_children(agent.pid))
    mesh = Probe.options(procs=procs).as_actor()
    caught = False
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not mesh.initialized.done():
        kids = _children(agent.pid)
        nodes = [p for p, n in kids.items() if n == "zmesh-fork" and p != fork and p not in before]
        if nodes:
            # The first fork seen has the largest part of the burst to fork.
            os.kill(fork if which == "forkserver" else min(nodes), signal.SIGKILL)
            caught = True
            break
    try:
        mesh.initialized.get(timeout=90)
    except zmesh.SpawnError:
        pass  # a rank of the burst was killed: a typed failure, never a hang
    else:
        assert len(set(mesh.pid.call().get(timeout=60).values())) == procs
    burst = set(_children(agent.pid)) - before - {fork}
    mesh.stop().get(timeout=60)
    # Every process of the burst is gone: forked, reported or not, and
    # whatever was started in place of what the tree could not fork.
    wait_gone(burst, 30, "the burst's processes after stop")
    wait_for(
        lambda: not (set(_children(agent.pid)) - before - {fork}),
        30, "no child of the agent left from the burst",
    )  # fmt: skip
    return caught


def test_kill_9_of_a_fork_mid_tree_ends_typed_and_leaves_nothing(
    agent: testing.AgentProcess,
) -> None:
    Probe.options(procs=1).as_actor().get(timeout=60)  # the forkserver is warm
    fork = _forkserver(agent)
    caught = any(_kill_mid_burst(agent, fork, "node", 64) for _ in range(3))
    assert caught, "no fork of the tree was seen mid-burst in 3 bursts"
    # The agent and its forkserver serve on: the next spawn is forked.
    again = Probe.options(procs=4).as_actor().get(timeout=60)
    assert len(set(again.pid.call().get(timeout=30).values())) == 4
    assert _forkserver(agent) == fork
    again.stop().get(timeout=30)


def test_kill_9_of_the_forkserver_mid_tree_ends_typed_and_leaves_nothing(
    agent: testing.AgentProcess,
) -> None:
    Probe.options(procs=1).as_actor().get(timeout=60)  # the forkserver is warm
    fork = _forkserver(agent)
    assert _kill_mid_burst(agent, fork, "forkserver", 16), "the tree was not seen mid-burst"
    wait_gone([fork], 10, "the forkserver")
    # Spawning goes on without it (fresh interpreters).
    again = Probe.options(procs=2).as_actor().get(timeout=90)
    assert len(set(again.pid.call().get(timeout=30).values())) == 2
    again.stop().get(timeout=30)

"""Helpers for testing code that uses zmesh (and for zmesh's own tests).

``local_cluster(n)`` starts ``n`` real agents on loopback, each its own
"host", points zmesh at them, and stops them (and every proc they run) when
the block ends::

    from zmesh.testing import local_cluster

    def test_my_actor():
        with local_cluster(2) as agents:
            mesh = MyActor.options(hosts=2).as_actor().get(timeout=30)
            ...

As a pytest fixture::

    @pytest.fixture
    def cluster():
        with local_cluster(2) as agents:
            yield agents
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

from zmesh import _local


@dataclass
class AgentProcess:
    """One agent started by ``local_cluster``."""

    label: str
    control: str
    stream: str
    pid: int
    log_dir: str
    popen: subprocess.Popen[bytes]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the agent (its procs die with it)."""
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(sig)


def start_agent(label: str, log_dir: str | None = None, timeout: float = 30.0) -> AgentProcess:
    """Start one agent process on loopback and wait until it is ready.

    Raises:
        AgentError: it did not become ready within ``timeout``.
    """
    log_dir = log_dir or tempfile.mkdtemp(prefix=f"zmesh-{label}-")
    popen, log_path = _local.launch_agent(label, log_dir)
    info = _local.await_ready(popen, log_path, timeout)
    return AgentProcess(label, info["control"], info["stream"], popen.pid, log_dir, popen)


def stop_agent(agent: AgentProcess, timeout: float = 5.0) -> None:
    """Stop an agent (SIGTERM: it stops its procs first), then SIGKILL if need be."""
    if agent.popen.poll() is None:
        agent.kill(signal.SIGTERM)
        try:
            agent.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            agent.kill(signal.SIGKILL)
            agent.popen.wait()


@contextlib.contextmanager
def local_cluster(n: int = 1) -> Iterator[list[AgentProcess]]:
    """Start ``n`` loopback agents as ``n`` hosts and make zmesh use them."""
    agents: list[AgentProcess] = []
    try:
        for i in range(n):
            agents.append(start_agent(f"host{i}"))
        _local.configure([a.control for a in agents])
        yield agents
    finally:
        _local.configure(None)
        _local.release_all()
        for a in agents:
            stop_agent(a)

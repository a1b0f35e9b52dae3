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
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

from zmesh import _local
from zmesh._errors import AgentError


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
    err = open(os.path.join(log_dir, "agent.log"), "ab")
    with err:
        popen = subprocess.Popen(
            [sys.executable, "-m", "zmesh", "agent", "--bind", "tcp://127.0.0.1:0",
             "--label", label, "--log-dir", log_dir],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
            start_new_session=True,
        )  # fmt: skip
    assert popen.stdout is not None
    deadline = time.monotonic() + timeout
    line = b""
    while time.monotonic() < deadline and popen.poll() is None:
        if select.select([popen.stdout], [], [], 0.1)[0]:
            line = popen.stdout.readline()
            break
    popen.stdout.close()
    if not line.startswith(b"ZMESH-AGENT-READY "):
        popen.kill()
        popen.wait()
        log_path = os.path.join(log_dir, "agent.log")
        raise AgentError(f"agent {label} did not start", log_path=log_path)
    info = json.loads(line.split(b" ", 1)[1])
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

"""Helpers for testing code that uses zmesh (and for zmesh's own tests).

``local_mesh(Cls, *args, procs=n)`` runs actors as instances in this
process behind a handle with a real mesh's adverbs, futures and errors (no
agent, no process), for fast unit tests of actor logic::

    from zmesh.testing import local_mesh

    def test_counter():
        with local_mesh(Counter, 10, procs=4) as mesh:
            assert mesh.incr.call(1).get(timeout=5).values() == [11] * 4

``local_cluster(n)`` starts ``n`` real agents on this machine, each its own
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

The agents listen on ipc:// sockets private to this user, as the embedded
default does; ``local_cluster(n, tcp=True)`` puts them on loopback TCP with
CURVE keys made for the block instead.

``pid_alive(pid)`` tells whether a process (say, a proc your test killed
with ``os.kill(mesh_pid, SIGKILL)``) still runs; a zombie counts as gone.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from zmesh._actor import ActorBase
from zmesh._client.control import local as _local
from zmesh._client.handles.inprocess import LocalEndpoint, LocalMesh, LocalStream, spawn
from zmesh._shared import paths as _paths
from zmesh._wire import security as _security


@dataclass
class AgentProcess:
    """One agent started by ``local_cluster`` or ``start_agent``."""

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


__all__ = [
    "AgentProcess",
    "LocalEndpoint",
    "LocalMesh",
    "LocalStream",
    "local_cluster",
    "local_mesh",
    "pid_alive",
    "start_agent",
    "stop_agent",
]

A = TypeVar("A", bound=ActorBase)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, dead but not reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"


def start_agent(
    label: str,
    log_dir: str | None = None,
    timeout: float = 30.0,
    *,
    bind: str | None = None,
    keys: str | None = None,
    insecure: bool = False,
) -> AgentProcess:
    """Start one agent process and wait until it is ready.

    Args:
        label: its host name.
        log_dir: its log directory (default: a new private run directory).
        timeout: how long it may take to start.
        bind: its control address (default ``ipc://``: private to this user;
            ``tcp://127.0.0.1:0`` needs ``keys``).
        keys: an agents' key directory (``zmesh keygen``), for TCP.
        insecure: allow TCP without keys (any local user could connect).

    Raises:
        AgentError: it did not become ready within ``timeout``.
        SecurityError: the log directory is not private to this user.
    """
    log_dir = log_dir or _paths.new_run_dir(f"{label}-{os.getpid()}", unique=True)
    popen, log_path = _local.launch_agent(label, log_dir, bind=bind, keys=keys, insecure=insecure)
    info = _local.await_ready(popen, log_path, timeout)
    return AgentProcess(label, info.control, info.stream, popen.pid, log_dir, popen)


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
def local_cluster(n: int = 1, *, tcp: bool = False) -> Iterator[list[AgentProcess]]:
    """Start ``n`` agents as ``n`` hosts and make zmesh use them.

    Args:
        n: how many agents.
        tcp: put them on loopback TCP with CURVE keys made for this block
            (which this process uses meanwhile), instead of ipc://.
    """
    agents: list[AgentProcess] = []
    before = _security.active()
    keys = _security.throwaway_keys(f"k{os.getpid()}-{secrets.token_hex(3)}") if tcp else None
    try:
        if keys is not None:
            _security.use(keys.dir)
        for i in range(n):
            if keys is not None:
                agents.append(start_agent(f"host{i}", bind="tcp://127.0.0.1:0", keys=keys.dir))
            else:
                agents.append(start_agent(f"host{i}"))
        _local.configure([a.control for a in agents])
        yield agents
    finally:
        _local.configure(None)
        _local.release_all()
        for a in agents:
            stop_agent(a)
        if keys is not None:
            _security.use(before.dir if before is not None else None)
            shutil.rmtree(keys.dir, ignore_errors=True)


# ---------------------------------------------------------------- local_mesh
#
# An in-process stand-in for a mesh, as httpx's MockTransport stands in for
# the network: the handle has the same adverbs, futures, values and errors
# as a real ActorMesh, but every actor is an instance in this process, run
# on one event loop in a thread of its own (sync endpoints in a thread pool,
# as in a proc). Arguments and results still go through the wire codec, so
# an actor gets copies and what cannot be sent fails as it would for real.


def local_mesh(
    cls: type[A], *args: Any, procs: int = 1, hosts: int = 1, **kwargs: Any
) -> LocalMesh[A]:
    """Make ``hosts x procs`` instances of ``cls`` in this process; their mesh handle.

    The handle has ``ActorMesh``'s adverbs (``call``, ``call_one``,
    ``broadcast``, ``choose``, ``stream``, ``slice``, ``options(timeout=)``),
    awaitable or ``.get()``-able ``zmesh.Future``\\ s, ``zmesh.ValueMesh``
    results and zmesh's errors: ``ActorError`` for an exception in an
    endpoint, ``EndpointError`` for an unknown endpoint or arguments that do
    not fit, ``EncodeError`` for a value that cannot be sent,
    ``CallTimeoutError``, ``ActorStoppedError`` after ``stop()``, and
    ``SupervisionError`` for a rank you ``kill()``\\ ed (or that raised
    ``SystemExit``). Inside an endpoint ``zmesh.current_rank()`` works.
    No agent, no process, no socket: for unit tests of actor logic.

    Use it as a context manager, or call ``stop()``::

        with local_mesh(Counter, 10, procs=4) as mesh:
            assert mesh.incr.call(1).get(timeout=5).values() == [11, 11, 11, 11]

    Args:
        cls: the actor class.
        *args: arguments of ``cls.__init__`` (each instance gets its own copy).
        procs: actors per host.
        hosts: hosts.
        **kwargs: keyword arguments of ``cls.__init__``.

    Raises:
        ValueError: a size below 1.
        EncodeError: an argument cannot be sent.
        SpawnError: ``__init__`` raised (nothing is left running).
    """
    return spawn(cls, args, kwargs, {"hosts": hosts, "procs": procs})

"""Helpers shared by zmesh's own tests: waiting, outcomes, and OS processes.

Everything here looks at real processes through ``/proc``; nothing is
mocked. ``tests/`` is on ``sys.path`` (``pythonpath`` in the pytest config),
so a test imports these as ``from _helpers import wait_for``.

* waiting: ``wait_for`` (blocking, returns the condition's value) and
  ``wait_until`` (async, returns how long it took); both fail with ``what``
  after a deadline, never sleep blindly;
* outcomes: ``outcome(fut)`` (when and how a future resolved, never raises),
  ``latency`` (print a measurement as ``LATENCY ...``; ``pytest -s`` shows it);
* processes: ``pid_alive``, ``wait_gone``, ``live_processes`` (the ``/proc``
  scan by environment tag), ``session_pids`` (this test session's zmesh
  processes, by kind), ``read_line`` (a child's stdout line with a deadline),
  ``run_python`` (a script run to its end with a deadline);
* meshes and services: ``status_of``, ``replica_pids``, ``module_mesh`` and
  ``keep_module_meshes`` (one mesh for a whole test module);
* the registry: ``own_runtime_dir`` (a runtime directory of the test's own).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import pytest

import zmesh
from zmesh._client.control import local as _local
from zmesh.testing import AgentProcess, pid_alive, start_agent, stop_agent

from _keptagents import stop_meshes

__all__ = [
    "ProcEntry",
    "connected",
    "keep_module_meshes",
    "latency",
    "live_processes",
    "module_mesh",
    "outcome",
    "own_runtime_dir",
    "pid_alive",
    "read_line",
    "replica_pids",
    "run_python",
    "session_pids",
    "status_of",
    "wait_for",
    "wait_gone",
    "wait_until",
]

T = TypeVar("T")
A = TypeVar("A", bound=zmesh.Actor)


# ------------------------------------------------------------ waiting


def wait_for(
    cond: Callable[[], T | Literal[False] | None], timeout: float, what: str, interval: float = 0.02
) -> T:
    """Poll ``cond`` until it returns something truthy (and return it); fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


async def wait_until(cond: Callable[[], Any], timeout: float, what: str) -> float:
    """Poll ``cond`` on the event loop until it is true; return how long it took, or fail."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            pytest.fail(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


# ------------------------------------------------------------ outcomes


async def outcome(fut: zmesh.Future[Any]) -> tuple[float, bool, Any]:
    """(when it resolved, ok, value or exception): never raises."""
    try:
        value = await fut
        return time.monotonic(), True, value
    except Exception as exc:
        return time.monotonic(), False, exc


def latency(what: str, seconds: float) -> None:
    """Print a measured latency (``pytest -s`` shows it) as ``LATENCY what: N ms``."""
    print(f"\nLATENCY {what}: {seconds * 1000:.0f} ms")


def status_of(mesh: zmesh.ActorMesh[Any], rank: int) -> zmesh.Status:
    """The supervision status the client holds for ``rank`` of ``mesh``."""
    return mesh.state().ranks[rank].status


async def replica_pids(svc: Any) -> list[int]:
    """The pid of each replica's (single) proc, in replica order (``Actor.pid`` endpoint)."""
    return [await svc.replica(i).pid.options(timeout=10).call_one() for i in range(len(svc))]


@contextlib.contextmanager
def own_runtime_dir(
    monkeypatch: pytest.MonkeyPatch, prefix: str = "zr-", unset: tuple[str, ...] = ()
) -> Iterator[str]:
    """A runtime directory (the registry ``zmesh get``/``ps`` read) of the block's own.

    Short (sockets go in it), named ``ZMESH_RUNTIME_DIR``; ``ZMESH_AGENTS``,
    ``ZMESH_HOSTFILE``, ``ZMESH_KEYS`` and the names in ``unset`` are unset,
    so nothing else is found. Removed after the block.
    """
    path = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    monkeypatch.setenv("ZMESH_RUNTIME_DIR", path)
    for var in ("ZMESH_AGENTS", "ZMESH_HOSTFILE", "ZMESH_KEYS", *unset):
        monkeypatch.delenv(var, raising=False)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True, name="_stop_everything")
def keep_module_meshes() -> Iterator[None]:
    """Imported by a module whose mesh outlives single tests: it replaces the
    per-test ``zmesh.shutdown()`` of tests/conftest.py (``module_mesh`` stops it)."""
    yield


def module_mesh(cls: type[A]) -> Iterator[zmesh.ActorMesh[A]]:
    """Body of a module-scoped fixture: one mesh of ``cls``; everything stops after the module."""
    mesh = cls.options().as_actor().get(timeout=60)
    yield mesh
    stop_meshes()


# ------------------------------------------------------------ processes


def wait_gone(pids: Iterable[int], timeout: float, what: str = "processes") -> None:
    """Wait until none of ``pids`` is alive."""
    pids = list(pids)
    try:
        wait_for(lambda: not any(pid_alive(p) for p in pids), timeout, f"{what} {pids} to exit")
    except AssertionError:
        left = [p for p in pids if pid_alive(p)]
        raise AssertionError(f"{what} still alive after {timeout}s: {left}") from None


@dataclass(frozen=True)
class ProcEntry:
    """One live process as ``/proc`` shows it."""

    pid: int
    environ: list[bytes]
    cmdline: list[bytes]
    comm: bytes


def live_processes(env: str) -> list[ProcEntry]:
    """Live processes (not zombies, not this one) whose environment holds ``env`` (``K=V``)."""
    needle = env.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            if needle not in environ:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().split(b"\0")
            with open(f"/proc/{entry}/comm", "rb") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if pid_alive(int(entry)):
            found.append(ProcEntry(int(entry), environ, cmdline, comm))
    return found


def session_pids(kind: str | None = None) -> set[int]:
    """Live processes started by this test session (tagged by tests/conftest.py).

    Args:
        kind: ``"proc"`` for actor processes, ``"agent"`` for agents,
            ``"forkserver"`` for agents' forkservers, ``None`` for all.
    """
    found = set()
    for p in live_processes(f"ZMESH_TEST_SESSION={os.environ['ZMESH_TEST_SESSION']}"):
        # A proc forked by its agent's forkserver keeps the forkserver's
        # command line; its name says what it is.
        is_proc = b"zmesh._host.proc.procserver" in p.cmdline or p.comm == b"zmesh-proc"
        if kind == "proc" and not is_proc:
            continue
        if kind == "forkserver" and p.comm != b"zmesh-fork":
            continue
        if kind == "agent" and not (b"zmesh" in p.cmdline and b"agent" in p.cmdline):
            continue
        found.add(p.pid)
    return found


def read_line(popen: subprocess.Popen[str], timeout: float) -> str:
    """One line of a child's stdout, within ``timeout`` seconds (or fail with its output)."""
    assert popen.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([popen.stdout], [], [], 0.05)
        if ready:
            line = popen.stdout.readline()
            if line:
                return line
            break  # EOF: the child exited
        if popen.poll() is not None:
            break
    popen.kill()
    out, err = popen.communicate(timeout=10)
    raise AssertionError(f"child printed no line within {timeout}s; stdout={out!r} stderr={err!r}")


def end_child(popen: subprocess.Popen[Any], timeout: float = 30.0) -> None:
    """Let a child finish (its stdin closed, its output drained), kill it if it
    takes over ``timeout`` s, and close its pipes on every path: a pipe left
    open raises ResourceWarning when a later test's GC finds it."""
    try:
        popen.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.communicate()
    except ValueError:  # a pipe was closed by hand already: wait, then close the rest
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
        for pipe in (popen.stdin, popen.stdout, popen.stderr):
            if pipe is not None:
                pipe.close()


@contextlib.contextmanager
def default_agent(monkeypatch: pytest.MonkeyPatch, label: str) -> Iterator[AgentProcess]:
    """A loopback agent of the block's own, which spawns use by default
    (``ZMESH_AGENTS``); everything on it, and the agent, stop after the block."""
    a = start_agent(label)
    monkeypatch.setenv("ZMESH_AGENTS", a.control)
    _local.configure(None)
    try:
        yield a
    finally:
        zmesh.shutdown()
        stop_agent(a)


@contextlib.contextmanager
def connected(controls: list[str], keys: str | None = None) -> Iterator[None]:
    """Point zmesh at ``controls`` for the block; stop its meshes and forget them after."""
    from zmesh._wire import security as _security

    zmesh.connect(controls, keys=keys)
    try:
        yield
    finally:
        zmesh.shutdown()
        _local.configure(None)
        _security.use(None)


def run_python(
    args: list[str], timeout: float, env: dict[str, str] | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` to the end within ``timeout`` seconds; fail with its output if not.

    The child sees this tree's zmesh (``PYTHONPATH`` as this process's
    ``sys.path``), and ``env`` on top of this process's environment.
    """
    import sys

    full = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **(env or {}))
    try:
        return subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, timeout=timeout,
            env=full, cwd=cwd, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout
        raise AssertionError(
            f"python {' '.join(args)} ran over {timeout}s; output:\n{out}"
        ) from exc


@contextlib.contextmanager
def keyed_loopback_agent(keys: str, logs: Path, label: str) -> Iterator[str]:
    """A ``zmesh agent`` on loopback TCP with the keys in ``keys``; its control address.

    It admits only the keys that directory authorises; its log is
    ``logs/agent.log``. Terminated (and waited for) on exit.
    """
    from zmesh._client.control.local import await_ready

    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "agent.log", "ab") as err:
        popen = subprocess.Popen(
            [sys.executable, "-m", "zmesh", "agent", "--bind", "tcp://127.0.0.1:0",
             "--keys", keys, "--label", label, "--log-dir", str(logs)],
            stdout=subprocess.PIPE, stderr=err, start_new_session=True,
        )  # fmt: skip
    try:
        yield await_ready(popen, str(logs / "agent.log")).control
    finally:
        popen.terminate()
        popen.wait(timeout=20)


ZMTP_ATTACKER = Path(__file__).parent / "integration" / "zmtp_attacker.py"


def run_attacker_as_nobody(
    py: str, attack_dir: str, plan: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Run ``tests/integration/zmtp_attacker.py`` as user ``nobody`` on ``plan``
    (from ``attack_dir``, which ``nobody`` can read); one result per target, in order."""
    script = os.path.join(attack_dir, "attacker.py")
    shutil.copy(ZMTP_ATTACKER, script)
    plan_path = os.path.join(attack_dir, "plan.json")
    with open(plan_path, "w") as f:
        json.dump(plan, f)
    for p in (script, plan_path):
        os.chmod(p, 0o644)
    done = subprocess.run(
        ["runuser", "-u", "nobody", "--", py, script, plan_path],
        capture_output=True, text=True, timeout=120, cwd="/",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]

"""Helpers shared by the core-fabric integration tests: waiting, and OS processes.

Everything here looks at real processes through ``/proc``; nothing is mocked.
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

import zmesh

T = TypeVar("T")


def wait_for(cond: Callable[[], T], timeout: float, what: str, interval: float = 0.02) -> T:
    """Poll ``cond`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state != b"Z"


def wait_gone(pids: Iterable[int], timeout: float, what: str = "processes") -> None:
    """Wait until none of ``pids`` is alive."""
    pids = list(pids)
    try:
        wait_for(lambda: not any(alive(p) for p in pids), timeout, f"{what} {pids} to exit")
    except AssertionError:
        left = [p for p in pids if alive(p)]
        raise AssertionError(f"{what} still alive after {timeout}s: {left}") from None


def session_pids(kind: str | None = None) -> set[int]:
    """Live processes started by this test session (tagged by tests/conftest.py).

    Args:
        kind: ``"proc"`` for actor processes, ``"agent"`` for agents,
            ``"forkserver"`` for agents' forkservers, ``None`` for all.
    """
    tag = os.environ["ZMESH_TEST_SESSION"]
    needle = f"ZMESH_TEST_SESSION={tag}".encode()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{entry}/comm", "rb") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if needle not in env or not alive(int(entry)):
            continue
        # A proc forked by its agent's forkserver keeps the forkserver's
        # command line; its name says what it is.
        is_proc = b"zmesh._host.proc" in cmd or comm == b"zmesh-proc"
        if kind == "proc" and not is_proc:
            continue
        if kind == "forkserver" and comm != b"zmesh-fork":
            continue
        if kind == "agent" and not (b"zmesh" in cmd and b"agent" in cmd):
            continue
        found.add(int(entry))
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


class Notebook(zmesh.Actor):
    """An actor that records tokens in arrival order (for ordering checks)."""

    notes: list[str]

    @zmesh.endpoint
    async def note(self, token: str) -> None:
        self.notes.append(token)

    @zmesh.endpoint
    async def seen(self) -> list[str]:
        return list(self.notes)

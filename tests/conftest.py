"""Fixtures for zmesh's own tests.

Every process a test starts carries ``ZMESH_TEST_SESSION`` in its
environment (agents pass it on to procs), so at the end of the session we
can find, by pid, any zmesh process that outlived its test, end it, and fail
the run.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

import zmesh
from zmesh.testing import AgentProcess, local_cluster

from _helpers import live_processes

SESSION_TAG = uuid.uuid4().hex
os.environ["ZMESH_TEST_SESSION"] = SESSION_TAG


def tagged_pids() -> list[int]:
    """Live processes (other than us) started by this test session."""
    return [p.pid for p in live_processes(f"ZMESH_TEST_SESSION={SESSION_TAG}")]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _stop_everything() -> Iterator[None]:
    """Whatever a test spawned on the embedded agent stops when it ends."""
    yield
    zmesh.shutdown()


@pytest.fixture
def cluster() -> Iterator[list[AgentProcess]]:
    """Two loopback agents, as two hosts."""
    with local_cluster(2) as agents:
        yield agents


# A test that times out leaves anyio's runner task inside the stuck test, so
# the teardown of its async fixtures then waits for that task forever, and
# pytest-timeout fires once per test. pytest also cancels faulthandler's timer
# (``faulthandler_timeout``) when a test fails. So each teardown gets a timer
# of its own: past it, every thread's stack is printed and the run ends (red,
# in minutes, with the stacks) instead of hanging until CI's budget is gone.
TEARDOWN_LIMIT = 150.0
_stderr_fd: list[int] = []


def pytest_configure(config: pytest.Config) -> None:
    _stderr_fd.append(os.dup(sys.stderr.fileno()))  # as pytest's faulthandler plugin does


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    faulthandler.dump_traceback_later(TEARDOWN_LIMIT, exit=True, file=_stderr_fd[0])
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    zmesh.shutdown()
    deadline = time.monotonic() + 5.0  # processes being stopped get a moment to exit
    while (leftovers := tagged_pids()) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not leftovers:
        return
    lines = []
    for pid in leftovers:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            lines.append(f"  {pid}: {cmd}")
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    print("\nzmesh processes outlived their tests (killed now):\n" + "\n".join(lines))
    session.exitstatus = pytest.ExitCode.TESTS_FAILED

"""Fixtures for zmesh's own tests.

Every process a test starts carries ``ZMESH_TEST_SESSION`` in its
environment (agents pass it on to procs), so at the end of the session we
can find, by pid, any zmesh process that outlived its test, end it, and fail
the run.

Under pytest-xdist (``-n``, on by default in the pytest config) each worker
is a session of its own: its own tag, its own runtime and log directories
(so one worker's ``zmesh ps`` or log reader never sees another's agents),
and its own end-of-session check, whose findings the controller prints and
turns into a failed run.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Generator, Iterator
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

import zmesh
from zmesh._shared import paths
from zmesh.testing import AgentProcess, local_cluster

import _keptagents
from _helpers import live_processes

# Bytecode for the processes the tests start. Where ``PYTHONDONTWRITEBYTECODE``
# is set (some CI images set it) and the clone is fresh, every agent,
# forkserver and script a test starts compiles zmesh and the stdlib modules it
# needs from source again: ~0.2 s of CPU a process, thousands of processes a
# run. They keep their bytecode in a private directory of this run instead
# (``PYTHONPYCACHEPREFIX``), so the tree stays as clean as the user asked.
# xdist workers inherit it from the controller.
if sys.flags.dont_write_bytecode and not os.environ.get("PYTHONPYCACHEPREFIX"):
    _pycache = tempfile.mkdtemp(prefix="zmesh-pyc-")  # 0700: nobody else writes our bytecode
    os.environ["PYTHONPYCACHEPREFIX"] = _pycache
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    atexit.register(shutil.rmtree, _pycache, True)

SESSION_TAG = uuid.uuid4().hex
os.environ["ZMESH_TEST_SESSION"] = SESSION_TAG

# An xdist worker ("gw0", "gw1", ...) runs its tests beside the others: the
# registry of local agents (the runtime directory) and the log root are
# per-user, so each worker gets directories of its own, next to the ones it
# would have used.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if WORKER:
    os.environ["ZMESH_RUNTIME_DIR"] = f"{paths.runtime_dir()}-{WORKER}"
    os.environ["ZMESH_LOG_DIR"] = f"{paths.log_root()}-{WORKER}"


# Made once the environment above is set: agents started in it may serve
# test after test (tests/_keptagents.py).
KEPT = _keptagents.begin()
FAILED = pytest.StashKey[bool]()


def tagged_pids() -> list[int]:
    """Live processes (other than us) started by this test session."""
    return [p.pid for p in live_processes(f"ZMESH_TEST_SESSION={SESSION_TAG}")]


class _Scheduling(LoadScopeScheduling):
    """xdist's load scheduling, with the tests that must share a worker kept together.

    Its groups ("scopes"), each run by one worker:

    * the netns tests (tests/multihost): they make links and routes in the
      root namespace (two subnets could meet), and three agents each are
      load enough for the machine;
    * a module with a shared (module- or class-scoped) fixture, such as one
      mesh of 16 agents: made once, not once on every worker, and its tests
      do not compete with each other for the cores. (tests/test_docs.py and
      tests/test_examples.py share only two agents, and run long: spread.)
    * every other test alone.

    (``xdist_group`` marks cannot say this: xdist 3.8 writes the group into
    a node id that pytest 9.2 no longer reads back.)
    """

    SPREAD = frozenset({"tests/test_docs.py", "tests/test_examples.py"})
    SHARED_FIXTURE = re.compile(r"""scope=["'](module|class)["']|\bmodule_mesh\(""")

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self.root = config.rootpath
        self.shares: dict[str, bool] = {}

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::")[0]
        if path.startswith("tests/multihost/"):
            return "netns"
        if path not in self.shares:
            try:
                text = (self.root / path).read_text()
            except OSError:
                text = ""
            self.shares[path] = path not in self.SPREAD and bool(self.SHARED_FIXTURE.search(text))
        return path if self.shares[path] else nodeid


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest work first, so that no worker starts a long chain when
    the others are nearly done: the netns tests (one chain on one worker),
    then modules with a ``slow`` or ``stress`` test, then the rest; in file
    order within each, and a module's tests together (they may share a
    fixture)."""

    def first(item: pytest.Item) -> int:
        if item.nodeid.startswith("tests/multihost/"):
            return 0
        return 1 if any(item.iter_markers("slow")) or any(item.iter_markers("stress")) else 2

    rank: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        rank[path] = min(rank.get(path, 2), first(item))
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])


class _XdistController:
    """Plugged into xdist's controller: the scheduling above, and the
    end-of-session findings of each worker."""

    def __init__(self) -> None:
        self.leftovers: list[str] = []

    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        return _Scheduling(config, log) if config.getvalue("dist") == "load" else None

    def pytest_testnodedown(self, node: Any, error: object) -> None:
        self.leftovers.extend(getattr(node, "workeroutput", {}).get("zmesh_leftovers", []))


_XDIST = _XdistController()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        item.stash[FAILED] = True
    return report


@pytest.fixture(autouse=True)
def _stop_everything(request: pytest.FixtureRequest) -> Iterator[None]:
    """Whatever a test spawned stops when it ends; the embedded agents it
    used may serve the next test (tests/_keptagents.py)."""
    yield
    KEPT.release(passed=not request.node.stash.get(FAILED, False))


@pytest.fixture
def faults() -> Iterator[list[zmesh.MeshFailure]]:
    """What ``zmesh.unhandled_fault_hook`` is given during the test (any thread
    may call it), in order; the test's meshes stop before the hook is restored."""
    got: list[zmesh.MeshFailure] = []
    lock = threading.Lock()

    def hook(failure: zmesh.MeshFailure) -> None:
        with lock:
            got.append(failure)

    zmesh.unhandled_fault_hook = hook
    try:
        yield got
    finally:
        _keptagents.stop_meshes()
        del zmesh.unhandled_fault_hook


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
    if hasattr(config.hook, "pytest_testnodedown"):  # xdist is loaded
        config.pluginmanager.register(_XDIST, "zmesh-xdist")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    faulthandler.dump_traceback_later(TEARDOWN_LIMIT, exit=True, file=_stderr_fd[0])
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


def _kill_leftovers() -> list[str]:
    """Kill this session's live processes; one line per process killed."""
    zmesh.shutdown()
    deadline = time.monotonic() + 5.0  # processes being stopped get a moment to exit
    while (leftovers := tagged_pids()) and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = []
    for pid in leftovers:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            lines.append(f"  {WORKER or 'pid'} {pid}: {cmd}")
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return lines


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller reports and fails the run
        workeroutput["zmesh_leftovers"] = _kill_leftovers()
        return
    # The controller of an xdist run starts no zmesh process, and its workers
    # carry its tag in their environment (so it must not kill by tag): it
    # reports what they found. A plain run checks its own.
    controller = session.config.pluginmanager.has_plugin("dsession")
    lines = _XDIST.leftovers if controller else _kill_leftovers()
    if not lines:
        return
    print("\nzmesh processes outlived their tests (killed now):\n" + "\n".join(lines))
    session.exitstatus = pytest.ExitCode.TESTS_FAILED

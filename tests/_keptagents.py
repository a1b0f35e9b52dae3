"""Embedded agents kept from one test to the next (on each test worker).

A test that spawns without naming agents gets zmesh's embedded agents, and
``zmesh.shutdown()`` after it used to stop them: each next test started its
own again, at ~1 s of CPU an agent and its forkserver, hundreds of times a
run. Now, when a test ends, every mesh it owns is stopped as before, but the
embedded agents stay for the next test, on one condition each, so that no
test can see what an earlier one did:

* the test passed (a failure's agent may be what failed: it goes);
* the agent runs with the client's environment as the test ended (once its
  fixtures undid what they set), and the next test's first spawn finds the
  client's still the same: a test that set ``ZMESH_*`` first (procs fork
  from the agent's forkserver, whose modules read it when imported) gets
  agents of its own, and the test after it fresh ones;
* once the test's meshes are stopped, the agent reports nothing alive: no
  rank short of Stopped or Failed, no detached mesh. Stopped meshes stay in
  its state as tombstones, as they would within one test.

A fixture that stops everything after its tests calls ``stop_meshes()``
rather than ``zmesh.shutdown()``: the same, but the agents stay (and go
after the test if it failed). A test that means to stop the agents
themselves still calls ``zmesh.shutdown()``.

Kept agents keep their places (``local``, ``local1``, ...): only a prefix of
the list is kept, so a later test that asks for one host gets ``local``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import zmesh
from zmesh._client.control import local as _local
from zmesh._client.control import logforward
from zmesh._client.control.agents import AgentLink
from zmesh._errors import AgentError
from zmesh._shared.state import Status
from zmesh._wire import messages as w

# What may differ between a kept agent's environment and the session's: the
# test's name, and the terminal's size (set by pytest's terminal writer).
_VOLATILE = frozenset({"PYTEST_CURRENT_TEST", "LINES", "COLUMNS"})
STOP_WAIT = 5.0  # for the test's meshes to be reported stopped


def _environment(pid: int) -> dict[bytes, bytes] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k: v for k, _, v in pairs if k.decode(errors="replace") not in _VOLATILE}


def _session_environment() -> dict[bytes, bytes]:
    return {k: v for k, v in os.environb.items() if k.decode(errors="replace") not in _VOLATILE}


class KeptAgents:
    """The worker's embedded agents, between tests (see the module's text)."""

    def __init__(self) -> None:
        self.environment = _session_environment()
        self.kept: list[subprocess.Popen[bytes]] = []  # from an earlier test

    def check_environment(self) -> None:
        """At a test's first spawn: stop the agents kept from an earlier test
        if the environment changed since. (Later spawns of the test find
        the agents it used so far, as they would without kept agents.)"""
        kept, self.kept = self.kept, []
        if not kept or _session_environment() == self.environment:
            return
        with _local._lock:
            stopping = [(p, a) for p, a in _local._embedded if p in kept]
            _local._embedded[:] = [(p, a) for p, a in _local._embedded if p not in kept]
        for popen, addr in stopping:
            _stop(popen, addr)

    def release(self, passed: bool) -> None:
        """``zmesh.shutdown()``, keeping the embedded agents the next test may use."""
        keep = self._candidates() if passed else []
        if keep:
            with _local._lock:  # out of reach of shutdown(), which would stop them
                _local._embedded[: len(keep)] = []
        zmesh.shutdown()
        clean = 0
        for _, addr in keep:
            if not _idle(addr):
                break
            clean += 1
        for popen, addr in keep[clean:]:
            _stop(popen, addr)
        kept = keep[:clean]
        if kept:
            with _local._lock:
                _local._embedded[:0] = kept
        self.kept = [popen for popen, _ in kept]

    def _candidates(self) -> list[tuple[subprocess.Popen[bytes], str]]:
        # What a test set and its fixtures did not undo (get_or_spawn_controller
        # publishes the job's registry for its procs) stays for the session:
        # agents started from now on carry it, and those are the ones kept.
        self.environment = _session_environment()
        if _local.configured_agents() is not None:
            return []
        with _local._lock:
            embedded = list(_local._embedded)
        keep = []
        for popen, addr in embedded:  # a prefix: places stay as they were
            if popen.poll() is not None or _environment(popen.pid) != self.environment:
                break
            keep.append((popen, addr))
        return keep


_kept: list[KeptAgents] = []


def begin() -> KeptAgents:
    """The session's kept agents; call once the session's environment is set.

    From then on every spawn first checks the environment (``check_environment``).
    """
    kept = KeptAgents()
    _kept[:] = [kept]
    find_agents = _local.agents

    def agents(hosts: int) -> list[str]:
        kept.check_environment()
        return find_agents(hosts)

    _local.agents = agents  # callers read it at each call
    return kept


def stop_meshes() -> None:
    """Stop every mesh this process owns, keeping the embedded agents for the
    next test (``zmesh.shutdown()`` outside a test session)."""
    if _kept:
        _kept[0].release(passed=True)
    else:
        zmesh.shutdown()


def _idle(addr: str) -> bool:
    """Whether the agent at ``addr`` reports nothing alive within ``STOP_WAIT``."""
    link = AgentLink(addr)
    deadline = time.monotonic() + STOP_WAIT
    try:
        while time.monotonic() < deadline:
            try:
                state = link.request(w.GetState, timeout=2.0)
            except AgentError:
                return False
            if not any(
                m.detached
                or any(not r.status.terminal or r.status is Status.TIMEOUT for r in m.ranks)
                for m in state.meshes
            ):
                return True
            time.sleep(0.02)
        return False
    finally:
        link.close(linger_ms=0)


def _alive(mesh: w.MeshReport) -> bool:
    """Whether anything of ``mesh`` may still run (a timed-out rank's proc may)."""
    return bool(mesh.detached) or any(
        not r.status.terminal or r.status is Status.TIMEOUT for r in mesh.ranks
    )


def _stop(popen: subprocess.Popen[bytes], addr: str) -> None:
    logforward.forget(addr)  # as zmesh.shutdown() does: a later flush does not wait for it
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
    try:
        popen.wait(timeout=4.0)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()

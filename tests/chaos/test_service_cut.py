"""A service handle inside an actor, when every agent of the service is gone.

The service's replicas all live on one agent ("far"); an actor on another
agent ("near") holds a handle of it. Then the far agent and its procs are
killed (SIGKILL) or frozen (SIGSTOP: a cut, nothing answers and nothing
closes). Whatever the handle was doing, a call in flight, new calls and a
stream, each ends with a typed zmesh error within its own timeout (plus
the supervision budget), never a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import zmesh
from zmesh._client.control import local as _local
from zmesh.testing import AgentProcess, start_agent, stop_agent

from _actors import Napper
from _helpers import replica_pids

pytestmark = [pytest.mark.chaos, pytest.mark.anyio]

SLACK = 1.5  # seconds past a call's timeout that its error may take under load


class Served(Napper):
    @zmesh.endpoint(concurrent=True)
    async def count(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i
            await asyncio.sleep(0.01)


class Caller(zmesh.Actor):
    """Calls the service it was given; says how each call ended, and when."""

    def __init__(self, svc: zmesh.Service) -> None:
        self.svc = svc

    @zmesh.endpoint(concurrent=True)
    async def nap(self, seconds: float, timeout: float) -> tuple[float, str, str]:
        t0 = time.monotonic()
        try:
            value = await self.svc.nap.options(timeout=timeout)(seconds)
            return time.monotonic() - t0, "ok", repr(value)
        except zmesh.ZmeshError as exc:  # anything else fails the test (ActorError)
            return time.monotonic() - t0, type(exc).__name__, str(exc)

    @zmesh.endpoint(concurrent=True)
    async def read(self, n: int, timeout: float) -> tuple[float, str, int]:
        t0 = time.monotonic()
        got = 0
        try:
            stream: Any = self.svc.count.options(timeout=timeout)(n)
            async for _ in stream:
                got += 1
            return time.monotonic() - t0, "ok", got
        except zmesh.ZmeshError as exc:
            return time.monotonic() - t0, type(exc).__name__, got


@pytest.fixture
def near_and_far() -> Iterator[tuple[AgentProcess, AgentProcess]]:
    near, far = start_agent("near"), start_agent("far")
    _local.configure([far.control])  # the service (and its respawns) go to "far"
    try:
        yield near, far
    finally:
        _local.configure(None)
        with contextlib.suppress(ProcessLookupError):
            os.kill(far.pid, signal.SIGCONT)
        zmesh.shutdown()
        _local.release_all()
        for agent in (near, far):
            stop_agent(agent)


@pytest.mark.parametrize("how", ["killed", "frozen"])
async def test_a_handle_fails_typed_and_in_time_when_every_agent_of_its_service_is_gone(
    near_and_far: tuple[AgentProcess, AgentProcess], how: str
) -> None:
    near, far = near_and_far
    svc = await Served.options(replicas=2, backoff_initial=0.1).spawn()
    procs = zmesh.HostMesh([near.control]).spawn_procs({"procs": 1})
    caller = procs.spawn("caller", Caller, svc)
    await caller
    assert (await caller.nap.call_one(0.0, 10))[1] == "ok"
    assert (await caller.read.call_one(5, 10))[1:] == ("ok", 5)
    pids = await replica_pids(svc)
    in_flight = caller.nap.options(timeout=60).call_one(30.0, 2.0)
    streaming = caller.read.options(timeout=60).call_one(10**6, 2.0)
    await asyncio.sleep(0.3)
    sig = signal.SIGKILL if how == "killed" else signal.SIGSTOP
    for pid in [far.pid, *pids]:  # the agent and every replica
        os.kill(pid, sig)
    typed = {"CallTimeoutError", "ServiceError", "SupervisionError", "StreamInterruptedError"}
    elapsed, kind, why = await in_flight
    assert kind in typed, (kind, why)
    assert elapsed < 2.0 + SLACK, (elapsed, kind, why)
    elapsed, kind, got = await streaming
    assert kind in typed and got > 0, (kind, got)
    assert elapsed < 2.0 + SLACK, (elapsed, kind)
    # New calls, and a new stream, through the same handle: each typed, in time.
    for timeout in (0.5, 1.0):
        elapsed, kind, why = await caller.nap.options(timeout=30).call_one(0.0, timeout)
        assert kind in typed, (kind, why)
        assert elapsed < timeout + SLACK, (elapsed, kind, why)
    elapsed, kind, got = await caller.read.options(timeout=30).call_one(10, 1.0)
    assert kind in typed and got == 0, (kind, got)
    assert elapsed < 1.0 + SLACK, (elapsed, kind)
    await caller.stop()

"""Thousands of calls cancelled at random moments never wedge their actor or lose a call.

A caller sends 2,000 calls (and 200 from a thread) to one actor (queued, running, answered: every
state at once) and cancels a random half of them at random moments, from
async code and from a thread at the same time. Every call that was not
cancelled returns its own value, every cancelled one raises
``CancelledError`` at its caller, the actor ran each call at most once and
served the next call at once, and its proc's backlog is empty again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import zmesh

pytestmark = pytest.mark.stress

CALLS = 2000


class Worker(zmesh.Actor):
    def __init__(self) -> None:
        self.ran: list[int] = []
        self.cancelled = 0

    @zmesh.endpoint
    async def work(self, i: int) -> int:
        self.ran.append(i)
        try:
            await asyncio.sleep(0.001 if i % 7 else 0.0)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return i

    @zmesh.endpoint
    def work_sync(self, i: int) -> int:
        time.sleep(0.0005)
        self.ran.append(-i)
        return -i

    @zmesh.endpoint
    async def report(self) -> dict[str, Any]:
        return {"ran": self.ran, "cancelled": self.cancelled}


@pytest.fixture
def worker() -> Iterator[zmesh.ActorMesh[Worker]]:
    mesh = Worker.options().as_actor().get(timeout=60)
    yield mesh
    mesh.stop().get(timeout=30)


def test_a_storm_of_cancels_loses_nothing(worker: zmesh.ActorMesh[Worker]) -> None:
    rng = random.Random(26)
    worker.report.call_one().get(timeout=30)

    def from_a_thread() -> tuple[int, int]:
        futs = [worker.work_sync.call_one(i) for i in range(1, 201)]
        gone = set(rng.sample(range(len(futs)), 100))
        for k in sorted(gone):
            futs[k].cancel()
        ok = cancelled = 0
        for k, f in enumerate(futs):
            try:
                assert f.get(timeout=60) == -(k + 1)
                ok += 1
            except concurrent.futures.CancelledError:
                assert k in gone
                cancelled += 1
        return ok, cancelled

    result: list[tuple[int, int]] = []
    thread = threading.Thread(target=lambda: result.append(from_a_thread()))
    thread.start()

    async def main() -> tuple[int, int]:
        futs = [asyncio.ensure_future(_await(worker.work.call_one(i))) for i in range(CALLS)]
        for k in rng.sample(range(CALLS), CALLS // 2):
            if rng.random() < 0.3:
                await asyncio.sleep(0)  # let some run, or finish, first
            futs[k].cancel()
        ok = cancelled = 0
        for k, f in enumerate(futs):
            try:
                assert await f == k
                ok += 1
            except asyncio.CancelledError:
                cancelled += 1
        return ok, cancelled

    ok, cancelled = asyncio.run(main())
    thread.join(120)
    assert not thread.is_alive()
    assert ok + cancelled == CALLS and cancelled > 0
    t_ok, t_cancelled = result[0]
    assert t_ok + t_cancelled == 200
    t0 = time.monotonic()
    report = worker.report.call_one().get(timeout=30)
    assert time.monotonic() - t0 < 5  # nothing left running or queued
    ran = [i for i in report["ran"] if i >= 0]
    assert len(ran) == len(set(ran))  # each at most once
    assert len(ran) >= ok  # every answered call ran
    assert len([i for i in report["ran"] if i < 0]) >= t_ok


async def _await(fut: zmesh.Future[int]) -> int:
    return await fut

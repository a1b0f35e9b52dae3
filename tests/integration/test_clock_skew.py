"""Deadlines do not depend on wall clocks agreeing.

A request carries the seconds its caller will still wait (its budget), and
each process keeps deadlines on its own monotonic clock. Here the replica's
proc runs with its wall clock moved 120 s ahead or behind: its actor's
``__init__`` replaces ``time.time`` in that process (a separate OS process,
so this is that process's clock, not the test's). With wall-clock deadlines,
+120 s made every call fail as "arrived too late", and -120 s made the proc
run requests its caller had long given up on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import zmesh

SKEW = 120.0


class Skewed(zmesh.Actor):
    """An actor whose whole proc sees a wall clock ``skew`` seconds off."""

    def __init__(self, skew: float) -> None:
        real = time.time
        time.time = lambda: real() + skew  # every reader in this process
        self.ran: list[str] = []

    @zmesh.endpoint
    async def wall(self) -> float:
        return time.time()

    @zmesh.endpoint
    async def record(self, tag: str) -> str:
        self.ran.append(tag)
        return tag

    @zmesh.endpoint
    async def seen(self) -> list[str]:
        return list(self.ran)

    @zmesh.endpoint
    async def slow(self, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "slow"

    @zmesh.endpoint
    async def count(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i


async def _late_one_is_skipped(target: zmesh.ActorMesh | zmesh.Service, seen: object) -> None:
    """A request that waits in the actor's queue past its budget is not run."""
    busy = asyncio.ensure_future(target.slow.call_one(1.0))
    await asyncio.sleep(0.1)  # (the slow call holds the actor; "late" queues behind it)
    t0 = time.monotonic()
    with pytest.raises(zmesh.CallTimeoutError):
        await target.record.options(timeout=0.3).call_one("late")
    assert time.monotonic() - t0 < 1.5, "the timeout fired late"
    assert await busy == "slow"
    assert await target.record.call_one("after") == "after"
    assert "late" not in await seen(), "a request past its deadline ran"  # type: ignore[operator]


@pytest.mark.anyio
@pytest.mark.parametrize("skew", [SKEW, -SKEW], ids=["ahead", "behind"])
async def test_a_skewed_replica_serves_and_keeps_deadlines(skew: float) -> None:
    svc: Any = await Skewed.options(replicas=1).as_service(skew)
    try:
        assert abs(await svc.wall() - time.time() - skew) < 5.0  # the skew is real
        assert await svc.record("a") == "a"
        assert await svc.record.options(timeout=5.0)("b") == "b"
        assert await svc.record.call("c") == ["c"]
        assert [i async for i in svc.count(3)] == [0, 1, 2]
        await _late_one_is_skipped(svc, lambda: svc.replica(0).seen.call_one())
        stats = svc.statistics()
        assert stats.state == "OK" and stats.failed == 1, stats  # only the timed-out one
    finally:
        await svc.stop()


@pytest.mark.anyio
@pytest.mark.parametrize("skew", [SKEW, -SKEW], ids=["ahead", "behind"])
async def test_a_skewed_proc_serves_every_path_and_keeps_deadlines(skew: float) -> None:
    mesh = await Skewed.options(procs=2).as_actor(skew)
    try:
        one = mesh.slice(procs=0)
        assert await one.record.options(timeout=5.0).call_one("a") == "a"
        assert (await mesh.record.options(timeout=5.0).call("b")).values() == ["b", "b"]
        assert await mesh.record.options(timeout=5.0).choose("c") == "c"
        got = [i async for i in one.count.options(timeout=5.0).call_one(3)]
        assert got == [0, 1, 2]
        # The synchronous path (its own socket, from a thread with no loop).
        sync = await asyncio.to_thread(
            lambda: one.record.options(timeout=5.0).call_one("sync").get(timeout=10)
        )
        assert sync == "sync"
        await _late_one_is_skipped(one, lambda: one.seen.call_one())
    finally:
        await mesh.stop()

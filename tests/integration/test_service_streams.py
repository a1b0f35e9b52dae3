"""Generator endpoints through a service (issues 14 and 15): one replica's items, routed.

``svc.gen.call_one(...)`` streams from one replica chosen by the service's
routing; a replica killed (SIGKILL) before the first item is replaced by
another without the reader seeing it, one killed after it ends the stream
with ``StreamInterruptedError`` and never repeats an item. Real procs, real
kills.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import zmesh

pytestmark = pytest.mark.anyio


class Gen(zmesh.Actor):
    """Streams ``range(n)``; says which of its streams are running and which closed."""

    def __init__(self) -> None:
        self.running = 0
        self.made = 0  # items yielded, over every stream
        self.closed: list[str] = []

    @zmesh.endpoint(concurrent=True)
    async def count(
        self, n: int, delay: float = 0.0, pause: float = 0.0, tag: str = ""
    ) -> AsyncIterator[int]:
        self.running += 1
        try:
            await asyncio.sleep(delay)  # a "prefill" before the first item
            for i in range(n):
                self.made += 1
                yield i
                if pause:
                    await asyncio.sleep(pause)
        finally:
            self.running -= 1
            self.closed.append(tag)

    @zmesh.endpoint
    def scount(self, n: int) -> Iterator[int]:
        yield from range(n)

    @zmesh.endpoint
    async def fail_after(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i
        raise KeyError("no more")

    @zmesh.endpoint(concurrent=True)
    async def produced(self) -> int:
        return self.made

    @zmesh.endpoint(concurrent=True)
    async def status(self) -> tuple[int, int, list[str]]:
        return os.getpid(), self.running, self.closed


class Reader(zmesh.Actor):
    """Reads a stream of the service it was given, from its own proc."""

    def __init__(self, svc: zmesh.Service) -> None:
        self.svc = svc

    @zmesh.endpoint
    async def read(self, n: int, delay: float = 0.0) -> list[int]:
        stream: Any = self.svc.count(n, delay)  # a generator endpoint: an ItemStream
        return [x async for x in stream]


async def busy_replica(svc: zmesh.Service, timeout: float = 10.0) -> tuple[int, int]:
    """``(index, pid)`` of the replica running a stream (polled from each replica)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for i in range(len(svc)):
            replica = svc.replica(i)
            if replica is None:
                continue
            pid, running, _ = await replica.status.options(timeout=5).call_one()
            if running:
                return i, pid
        await asyncio.sleep(0.01)
    pytest.fail(f"no replica started a stream within {timeout}s")


async def test_a_stream_through_a_service_arrives_in_order_from_either_form() -> None:
    svc = await Gen.options(replicas=2).spawn()
    try:
        assert [x async for x in svc.count.call_one(1000)] == list(range(1000))
        assert [x async for x in svc.count(1000)] == list(range(1000))  # the direct form
        assert [x async for x in svc.scount(300)] == list(range(300))  # a sync generator
        stats = svc.statistics()
        assert sum(r.completed for r in stats.replicas) == 3
        assert all(r.completed for r in stats.replicas)  # routed over both replicas
        assert all(r.in_flight == 0 for r in stats.replicas)  # each gave its slot back
        # Plain code reads it with ``for``.
        got = await asyncio.to_thread(lambda: list(svc.count.call_one(1000)))
        assert got == list(range(1000))
        with pytest.raises(TypeError, match="generator endpoint"):
            svc.count.call(3)
        # The generator's own error comes after its items, and is not retried.
        got = []
        with pytest.raises(zmesh.ActorError, match="no more"):
            async for x in svc.fail_after(2):
                got.append(x)
        assert got == [0, 1] and svc.statistics().retried == 0
        stats = svc.statistics()
        # A session's streams stay on its replica.
        async with svc.session() as session:
            for _ in range(4):
                assert [x async for x in svc.count(10)] == list(range(10))
        after = svc.statistics()
        pairs = zip(after.replicas, stats.replicas, strict=True)
        moved = [a.completed - b.completed for a, b in pairs]
        assert sorted(moved) == [0, 4] and moved.index(4) == session.replica
    finally:
        await svc.stop()


async def test_an_open_stream_is_load_and_break_runs_the_finally_in_the_replica() -> None:
    svc = await Gen.options(replicas=2, router="least_loaded").spawn()
    try:
        first = svc.count.call_one(10**6, pause=0.001, tag="first")
        assert await first.__anext__() == 0
        index, _ = await busy_replica(svc)
        # The open stream holds its replica's slot: least-loaded picks the other.
        loads = []
        async for x in svc.count.choose(10**6, pause=0.001, tag="second"):
            if x == 0:
                loads = [r.in_flight for r in svc.statistics().replicas]
            if x == 3:
                break  # the stream is dropped: the generator closes in its replica
        assert loads == [1, 1], loads
        await first.aclose()
        other = svc.replica(1 - index)
        assert other is not None

        async def closed(replica: Any) -> list[str]:
            return list((await replica.status.call_one())[2])

        deadline = time.monotonic() + 10
        while "second" not in await closed(other) or "first" not in await closed(
            svc.replica(index)
        ):
            assert time.monotonic() < deadline, "a finally did not run"
            await asyncio.sleep(0.02)
        assert [r.in_flight for r in svc.statistics().replicas] == [0, 0]
        # A reader that stops reading holds its producer to the window.
        replicas = [svc.replica(i) for i in range(2)]
        before = [await r.produced.call_one() for r in replicas if r is not None]
        slow = svc.count.options(window=4).call_one(10**6)
        assert await slow.__anext__() == 0
        await asyncio.sleep(0.5)  # time to run ahead, were it allowed
        after = [await r.produced.call_one() for r in replicas if r is not None]
        assert sorted(a - b for a, b in zip(after, before, strict=True)) == [0, 4]
        assert [await slow.__anext__() for _ in range(20)] == list(range(1, 21))
        await slow.aclose()
        # Stopping the service ends an open stream: "you stopped it".
        last = svc.count.call_one(10**6, pause=0.001)
        assert await last.__anext__() == 0
        await svc.stop()
        with pytest.raises(zmesh.ActorStoppedError):
            async for _ in last:
                pass
    finally:
        await svc.stop()


@pytest.mark.chaos
async def test_a_replica_killed_before_the_first_item_fails_over_unseen() -> None:
    svc = await Gen.options(replicas=2, backoff_initial=0.1).spawn()
    try:
        s = svc.count.options(timeout=30).call_one(200, delay=1.0)
        index, pid = await busy_replica(svc)
        os.kill(pid, signal.SIGKILL)  # while it "prefills"
        t0 = time.monotonic()
        assert [x async for x in s] == list(range(200))  # every item once, in order
        assert time.monotonic() - t0 < 5.0
        stats = svc.statistics()
        assert stats.retried == 1
        assert stats.replicas[index].sent_after_failure == 0
        assert stats.replicas[1 - index].completed == 1
    finally:
        await svc.stop()


@pytest.mark.chaos
async def test_a_replica_killed_after_the_first_item_ends_the_stream_with_a_typed_error() -> None:
    svc = await Gen.options(replicas=2, backoff_initial=0.1).spawn()
    try:
        s = svc.count.call_one(10**6, pause=0.01)
        got = [await s.__anext__() for _ in range(3)]
        index, pid = await busy_replica(svc)
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(zmesh.StreamInterruptedError) as info:
            async for x in s:
                got.append(x)
        assert time.monotonic() - t0 < 2.0  # as fast as any call to a dead proc fails
        assert got == list(range(len(got)))  # no item twice, none skipped
        err = info.value
        assert isinstance(err, zmesh.SupervisionError)
        assert (err.replica, err.generation, err.mesh) == (index, 1, zmesh.service_info(svc).name)
        assert err.items >= len(got)
        assert "SIGKILL" in err.reason and "would repeat" in str(err)
        assert svc.statistics().retried == 0  # not re-sent
        # The service goes on: the next stream is whole.
        assert [x async for x in svc.count.options(timeout=30)(50)] == list(range(50))
    finally:
        await svc.stop()


@pytest.mark.chaos
async def test_a_handle_inside_an_actor_streams_and_fails_over() -> None:
    svc = await Gen.options(replicas=2, backoff_initial=0.1).spawn()
    reader = await Reader.options().spawn(svc)
    try:
        assert await reader.read(500) == list(range(500))
        running = reader.read.options(timeout=60).call_one(100, 1.0)
        _, pid = await busy_replica(svc)
        os.kill(pid, signal.SIGKILL)  # before the first item: the handle moves it
        assert await running == list(range(100))
    finally:
        await reader.stop()
        await svc.stop()


@pytest.mark.stress
@pytest.mark.chaos
async def test_many_streams_while_a_replica_is_killed_lose_and_repeat_nothing() -> None:
    # 24 streams of 400 items at once over 2 replicas; one replica is killed
    # mid-run. Each stream either arrives whole and in order, or (started on
    # the dead replica) ends with StreamInterruptedError after an in-order
    # prefix; streams still waiting for their first item move unseen.
    svc = await Gen.options(replicas=2, backoff_initial=0.1).spawn()
    try:
        results: list[tuple[list[int], BaseException | None]] = []

        async def one(k: int) -> None:
            got: list[int] = []
            try:
                async for x in svc.count.options(timeout=60)(400, delay=0.3 * (k % 3), pause=0.002):
                    got.append(x)
            except zmesh.StreamInterruptedError as exc:
                results.append((got, exc))
                return
            results.append((got, None))

        tasks = [asyncio.ensure_future(one(k)) for k in range(24)]
        _, pid = await busy_replica(svc)
        await asyncio.sleep(0.2)
        os.kill(pid, signal.SIGKILL)
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        whole = [g for g, e in results if e is None]
        cut = [(g, e) for g, e in results if e is not None]
        assert len(results) == 24
        for g in whole:
            assert g == list(range(400))
        for g, e in cut:
            assert g == list(range(len(g))) and g, "a cut stream had started"
            assert isinstance(e, zmesh.StreamInterruptedError) and e.items >= len(g)
        assert cut, "the kill cut no stream"
        assert svc.statistics().retried >= 1  # the ones waiting on the prefill moved
    finally:
        await svc.stop()

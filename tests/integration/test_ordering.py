"""Send order per sender, one message at a time per actor, and sync endpoints that block."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import zmesh

from _helpers import (
    keep_module_meshes,  # noqa: F401  (a fixture: the mesh outlives tests)
    module_mesh,
    wait_for,
)

N = 1000


class Log(zmesh.Actor):
    def __init__(self) -> None:
        self.log: list[int] = []
        self.running = 0
        self.overlap = 0

    @zmesh.endpoint
    async def append(self, i: int) -> int:
        self.running += 1
        self.overlap = max(self.overlap, self.running)
        await asyncio.sleep(0)  # a chance to interleave, were it allowed
        self.log.append(i)
        self.running -= 1
        return len(self.log) - 1

    @zmesh.endpoint
    def append_sync(self, i: int) -> int:
        self.log.append(i)
        return len(self.log) - 1

    @zmesh.endpoint
    async def take(self) -> tuple[list[int], int]:
        log, self.log = self.log, []
        overlap, self.overlap = self.overlap, 0
        return log, overlap


@pytest.fixture(scope="module")
def log_actor() -> Iterator[zmesh.ActorMesh[Log]]:
    yield from module_mesh(Log)


@pytest.mark.anyio
@pytest.mark.parametrize("endpoint", ["append", "append_sync"])
async def test_pipelined_calls_run_in_send_order_async(
    log_actor: zmesh.ActorMesh[Log], endpoint: str
) -> None:
    ep = getattr(log_actor, endpoint)
    futures = [ep.call_one(i) for i in range(N)]  # all sent before any is awaited
    positions = await asyncio.gather(*(asyncio.ensure_future(_aw(f)) for f in futures))
    assert positions == list(range(N))
    log, overlap = await log_actor.take.call_one()
    assert log == list(range(N))
    assert overlap <= 1  # one message at a time


async def _aw(fut: zmesh.Future[Any]) -> Any:
    return await fut


@pytest.mark.parametrize("endpoint", ["append", "append_sync"])
def test_pipelined_calls_run_in_send_order_sync(
    log_actor: zmesh.ActorMesh[Log], endpoint: str
) -> None:
    ep = getattr(log_actor, endpoint)
    futures = [ep.call_one(i) for i in range(N)]
    assert [f.get(timeout=30) for f in futures] == list(range(N))
    log, overlap = log_actor.take.call_one().get(timeout=10)
    assert log == list(range(N))
    assert overlap <= 1


def test_broadcasts_and_calls_keep_their_relative_order(log_actor: zmesh.ActorMesh[Log]) -> None:
    for i in range(N):
        if i % 2:
            log_actor.append.broadcast(i)
        else:
            log_actor.append.call_one(i)
    log, _ = log_actor.take.call_one().get(timeout=30)
    assert log == list(range(N))


def test_two_senders_each_keep_their_order(log_actor: zmesh.ActorMesh[Log]) -> None:
    # Each thread's sync calls go out in its own order; the actor sees each
    # thread's sequence in order (interleaved with the other's).
    errors: list[BaseException] = []

    def send(base: int) -> None:
        try:
            futs = [log_actor.append.call_one(base + i) for i in range(300)]
            for f in futs:
                f.get(timeout=30)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(b,)) for b in (0, 10_000)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    log, _ = log_actor.take.call_one().get(timeout=10)
    assert [x for x in log if x < 10_000] == list(range(300))
    assert [x for x in log if x >= 10_000] == [10_000 + i for i in range(300)]


# ------------------------------------------- a blocking sync endpoint


class Blocker(zmesh.Actor):
    @zmesh.endpoint
    def block(self, seconds: float, flag: str) -> float:
        Path(flag).write_text("in")
        start = time.monotonic()
        time.sleep(seconds)  # blocks a worker thread, never the proc's loop
        return time.monotonic() - start


class Pinger(zmesh.Actor):
    @zmesh.endpoint
    async def ping(self) -> int:
        return os.getpid()

    @zmesh.endpoint
    def ping_sync(self) -> int:
        return os.getpid()


def test_blocking_sync_endpoint_does_not_stall_other_actors(tmp_path: Path) -> None:
    procs = zmesh.this_host().spawn_procs(per_host={"procs": 1}).get(timeout=60)
    a = procs.spawn("a", Blocker).get(timeout=30)
    b = procs.spawn("b", Pinger).get(timeout=30)
    pid = b.ping.call_one().get(timeout=10)  # warm: the connection exists
    assert b.ping_sync.call_one().get(timeout=10) == pid  # same proc

    flag = tmp_path / "blocking"
    blocked = a.block.call_one(2.0, str(flag))
    wait_for(flag.exists, 10, "the sync endpoint to start blocking")

    latencies = []
    for ep in (b.ping, b.ping_sync, b.ping, b.ping_sync, b.ping):
        t0 = time.monotonic()
        assert ep.call_one().get(timeout=5) == pid
        latencies.append(time.monotonic() - t0)
    assert not blocked.done(), "the blocking call ended before we measured"
    # A stall would take the whole 2 s; the median answers within 100 ms and
    # no single reply (on a noisy shared 2-core machine) takes more than 0.5 s.
    assert sorted(latencies)[len(latencies) // 2] < 0.1, latencies
    assert max(latencies) < 0.5, latencies

    slept = blocked.get(timeout=10)
    assert slept >= 2.0
    # The proc kept heartbeating all along: the agent never declared it hung.
    assert procs.state().status == zmesh.Status.RUNNING
    assert a.block.call_one(0, str(flag)).get(timeout=10) >= 0
    procs.stop().get(timeout=10)


@pytest.mark.anyio
async def test_blocking_sync_endpoint_does_not_stall_other_actors_async(tmp_path: Path) -> None:
    procs = await zmesh.this_host().spawn_procs(per_host={"procs": 1})
    a = await procs.spawn("a", Blocker)
    b = await procs.spawn("b", Pinger)
    pid = await b.ping.call_one()

    flag = tmp_path / "blocking"
    blocked = asyncio.ensure_future(_aw(a.block.call_one(2.0, str(flag))))
    deadline = time.monotonic() + 10
    while not flag.exists():
        assert time.monotonic() < deadline, "the sync endpoint never started"
        await asyncio.sleep(0.01)

    latencies = []
    for _ in range(3):
        t0 = time.monotonic()
        assert await b.ping.call_one() == pid
        latencies.append(time.monotonic() - t0)
    assert min(latencies) < 0.1 and max(latencies) < 0.5, latencies
    assert not blocked.done()
    assert await blocked >= 2.0
    await procs.stop()


class Hog(zmesh.Actor):
    """An async endpoint that holds the proc's loop (CPU work, no await)."""

    @zmesh.endpoint
    async def work(self, seconds: float) -> float:
        started = time.time()
        time.sleep(seconds)  # deliberately blocks the loop, as CPU work would
        return started


@pytest.mark.anyio
async def test_replies_do_not_wait_behind_later_slow_calls() -> None:
    """Replies are batched, but a reply is not held back while later calls run."""
    hog = await Hog.options().as_actor()
    try:
        ref = hog.slice(procs=0)
        # The first call of a loop turn goes out alone; the next eight share
        # a batch, so the proc handles them in one pass.
        lead = ref.work.call_one(0.0)
        futs = [ref.work.call_one(0.06) for _ in range(8)]  # call 8 starts ~0.4 s in
        await lead
        await futs[0]
        first_reply_at = time.time()
        starts = [await f for f in futs]
        assert starts == sorted(starts)
        assert first_reply_at < starts[-1], "reply 1 waited for call 8 to start"
    finally:
        await hog.stop()


class Busy(zmesh.Actor):
    def __init__(self) -> None:
        self.log: list[str] = []

    @zmesh.endpoint
    async def work(self, tag: str, seconds: float) -> str:
        self.log.append(f"start {tag}")
        await asyncio.sleep(seconds)
        self.log.append(f"end {tag}")
        return tag

    @zmesh.endpoint
    def block(self, seconds: float) -> None:
        time.sleep(seconds)  # a sync endpoint: runs in a worker thread

    @zmesh.endpoint(concurrent=True)
    async def status(self) -> list[str]:
        self.log.append("status")
        return list(self.log)


@pytest.mark.anyio
@pytest.mark.parametrize("in_progress", ["async", "sync"])
async def test_a_concurrent_endpoint_does_not_wait_for_the_call_in_progress(
    in_progress: str,
) -> None:
    busy = await Busy.options().as_actor()
    ref = busy.slice(procs=0)
    if in_progress == "async":
        long: zmesh.Future[Any] = ref.work.call_one("long", 30.0)
    else:
        long = ref.block.call_one(30.0)  # blocks a worker thread
    try:
        seen = await ref.status.options(timeout=10).call_one()
        assert seen[-1] == "status" and not long.done()
    finally:
        await busy.stop()
        with pytest.raises(zmesh.ActorStoppedError):
            await long  # stopped mid-call: it fails, it does not hang


@pytest.mark.anyio
async def test_a_concurrent_endpoint_never_overtakes_a_queued_message() -> None:
    busy = await Busy.options().as_actor()
    try:
        ref = busy.slice(procs=0)
        first = ref.work.call_one("first", 0.3)
        second = ref.work.call_one("second", 0.0)  # queued behind first
        seen = await ref.status.options(timeout=10).call_one()
        assert seen == ["start first", "end first", "start second", "end second", "status"]
        assert await first == "first" and await second == "second"
    finally:
        await busy.stop()

"""Stopping actors that live on a proc mesh ends every call in flight to them.

``ActorMesh.stop()`` of actors spawned on a ``ProcMesh`` leaves the procs
running; the calls to the stopped actors that were running (an ``async def``
endpoint awaiting, a sync one in its worker thread, ``concurrent`` ones, a batch),
queued behind them, or streaming (a sync and an async generator) fail at once
with ``ActorStoppedError``, not at their timeout, and an actor beside them on
the same procs serves on.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import zmesh

BUDGET = 30.0  # each call's own timeout: far past what the test allows for the stop
PROMPT = 5.0  # how soon after the stop every call must have failed (a loaded machine)
QUEUED = 300  # calls queued behind the running one, per actor


class Busy(zmesh.Actor):
    """Endpoints that stay busy until their actor is stopped."""

    def __init__(self) -> None:
        self.running = 0
        self.lock = threading.Lock()

    @zmesh.endpoint
    async def nap(self, seconds: float) -> float:
        self.running += 1
        await asyncio.sleep(seconds)
        return seconds

    @zmesh.endpoint
    def block(self, seconds: float) -> float:
        with self.lock:
            self.running += 1
        time.sleep(seconds)
        return seconds

    @zmesh.endpoint(concurrent=True)
    async def side(self, seconds: float) -> float:
        self.running += 1
        await asyncio.sleep(seconds)
        return seconds

    @zmesh.endpoint(batch=4, batch_wait=0.01)
    async def batched(self, items: list[float]) -> list[float]:
        self.running += 1
        await asyncio.sleep(max(items))
        return items

    @zmesh.endpoint(concurrent=True)
    async def started(self) -> int:
        return self.running

    @zmesh.endpoint
    def gen_sync(self, count: int, gap: float) -> Iterator[int]:
        for i in range(count):
            time.sleep(gap)
            yield i

    @zmesh.endpoint
    async def gen_async(self, count: int, gap: float) -> AsyncIterator[int]:
        for i in range(count):
            await asyncio.sleep(gap)
            yield i

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()


async def _first_then_rest(stream: Any) -> list[int]:
    """Read a stream to its end (it must not end: its actor is stopped)."""
    return [i async for i in stream]


@pytest.mark.stress
@pytest.mark.anyio
async def test_stop_fails_running_queued_and_streaming_calls_at_once() -> None:
    procs = await zmesh.this_host().spawn_procs(per_host={"procs": 2})
    try:
        bystander = await procs.spawn("bystander", Busy)
        calls: dict[str, asyncio.Future[Any]] = {}
        # One actor mesh per kind of running work: an actor runs one message at a time.
        names = ("nap", "block", "batched", "gen_sync", "gen_async")
        meshes = {n: await procs.spawn(f"busy-{n.replace('_', '-')}", Busy) for n in names}
        # Several actors per proc: a call to all of them is one message per proc.
        group = await procs.spawn("busy-group", Busy, actors_per_proc=3)
        calls["group"] = asyncio.ensure_future(
            _awaited(group.nap.options(timeout=BUDGET).call(BUDGET))
        )
        await _started(group, "the group's nap")
        for k in range(QUEUED // 10):
            calls[f"group/queued{k}"] = asyncio.ensure_future(
                _awaited(group.nap.options(timeout=BUDGET).call(0.0))
            )
        meshes["group"] = group
        # A sync endpoint's parts run in a worker thread, outside the actors' tasks.
        sync_group = await procs.spawn("busy-group-sync", Busy, actors_per_proc=3)
        blocking = sync_group.block.options(timeout=BUDGET)
        calls["group/block"] = asyncio.ensure_future(_awaited(blocking.call(BUDGET)))
        await _started(sync_group, "the group's block")
        meshes["group/block"] = sync_group
        for n in names:
            mesh = meshes[n]
            ep = getattr(mesh, n).options(timeout=BUDGET)
            if n in ("nap", "block", "batched"):
                calls[n] = asyncio.ensure_future(_awaited(ep.call(BUDGET)))
                await _started(mesh, n)
                # Concurrent calls beside it, and many queued behind it.
                side = mesh.side.options(timeout=BUDGET)
                calls[f"{n}/side"] = asyncio.ensure_future(_awaited(side.call(BUDGET)))
                for k in range(QUEUED):
                    calls[f"{n}/queued{k}"] = asyncio.ensure_future(_awaited(ep.call(0.0)))
            else:
                for r in range(2):
                    one = mesh.slice(procs=r)
                    stream = getattr(one, n).options(timeout=BUDGET).call_one(10_000, 0.01)
                    it = aiter(stream)
                    assert await anext(it) == 0  # the generator is under way
                    calls[f"{n}[{r}]"] = asyncio.ensure_future(_first_then_rest(it))
        await asyncio.sleep(0)
        t0 = time.monotonic()
        await asyncio.gather(*(m.stop() for m in meshes.values()))
        _, late = await asyncio.wait(calls.values(), timeout=PROMPT)
        hung = [k for k, f in calls.items() if f in late]
        assert not hung, f"still pending {PROMPT}s after the stop: {hung[:10]} ({len(hung)})"
        wrong = {k: f.exception() or f.result() for k, f in calls.items()
                 if not isinstance(f.exception(), zmesh.ActorStoppedError)}  # fmt: skip
        assert not wrong, f"not ActorStoppedError: {dict(list(wrong.items())[:5])}"
        print(f"{len(calls)} calls failed with ActorStoppedError within "
              f"{time.monotonic() - t0:.2f}s of the stop")  # fmt: skip
        # The procs live on: an actor beside the stopped ones serves its next message.
        assert len((await bystander.pid.call()).values()) == 2
    finally:
        await procs.stop()


async def _awaited(fut: zmesh.Future[Any]) -> Any:
    return await fut


async def _started(mesh: zmesh.ActorMesh[Busy], what: str) -> None:
    """Wait until every actor of ``mesh`` has started its long call (a concurrent endpoint says)."""
    deadline = time.monotonic() + 20
    while not all(c >= 1 for c in (await mesh.started.call()).values()):
        assert time.monotonic() < deadline, f"not started within 20s: {what}"
        await asyncio.sleep(0.02)

"""Request batching (issue 15 item 5): callers send one item each, the proc
runs up to ``batch`` of them as one invocation. Real procs and sockets."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import zmesh
from zmesh._client.calls import runtime as _runtime
from zmesh._shared.stats import EndpointStatistics
from zmesh._wire import messages as w

pytestmark = pytest.mark.anyio


class Embedder(zmesh.Actor):
    def __init__(self) -> None:
        self.batch_sizes: list[int] = []

    @zmesh.endpoint(batch=8, batch_wait=0.05)
    async def embed(self, xs: list[int]) -> list[int]:
        self.batch_sizes.append(len(xs))
        if any(x < 0 for x in xs):
            raise ValueError(f"negative in {xs}")
        return [10 * x for x in xs]

    @zmesh.endpoint(batch=4, batch_wait=0.05)
    def embed_sync(self, xs: list[int]) -> list[int]:
        return [x + 1 for x in xs]

    @zmesh.endpoint(batch=4, batch_wait=0.01)
    async def short(self, xs: list[int]) -> list[int]:
        return xs[:-1]  # one value too few: every caller is told

    @zmesh.endpoint
    async def sizes_seen(self) -> list[int]:
        return list(self.batch_sizes)


async def endpoint_stats(
    mesh: Any, name: str, batches: int = 1, timeout: float = 10.0
) -> EndpointStatistics:
    """The proc's counters for ``name`` once its agent has heard of ``batches``
    batches (what the agent knows is about 1 s old)."""
    ref = mesh._refs[0]
    rt, _ = _runtime.current()
    deadline = time.monotonic() + timeout
    while True:
        reply = await rt.controller.agent(ref.agent).request(lambda i: w.GetStats(i))
        for proc in reply.stats.procs:
            if proc.mesh == ref.mesh:
                for actor in proc.actors:
                    for ep in actor.endpoints:
                        if ep.name == name and ep.batches >= batches:
                            return ep
        if time.monotonic() > deadline:
            pytest.fail(f"no statistics of {batches} batches of {name} within {timeout}s")
        await asyncio.sleep(0.2)


async def test_32_single_calls_run_as_at_most_4_invocations() -> None:
    one = await Embedder.options().spawn()
    try:
        results = await asyncio.gather(*(one.embed(i) for i in range(32)))
        assert results == [10 * i for i in range(32)]  # each caller its own element
        sizes = await one.sizes_seen.call_one()
        assert sum(sizes) == 32 and len(sizes) <= 4, sizes
        # A batch that raises fails each of its callers with the exception.
        mixed = await asyncio.gather(*(one.embed(x) for x in [1, -1, 2]), return_exceptions=True)
        assert all(isinstance(r, zmesh.ActorError) for r in mixed), mixed
        assert "negative" in str(mixed[0])
        # A lone call runs after batch_wait with a batch of one.
        assert await one.embed(7) == 70
        assert await asyncio.gather(*(one.embed_sync(i) for i in range(6))) == list(range(1, 7))
        wrong = await asyncio.gather(*(one.short(i) for i in range(4)), return_exceptions=True)
        assert all("must return a list of 4" in str(r) for r in wrong), wrong
        with pytest.raises(zmesh.EndpointError, match="one item per call"):
            await one.embed(1, 2)  # type: ignore[call-arg]
        stats = await endpoint_stats(one, "embed", batches=6)
        assert stats.batches >= 6 and stats.batched >= 36
        assert stats.mean_batch is not None and stats.mean_batch > 4
    finally:
        await one.stop()


async def test_batching_through_a_service() -> None:
    svc = await Embedder.options(replicas=2).spawn()
    try:
        results = await asyncio.gather(*(svc.embed(i) for i in range(64)))
        assert results == [10 * i for i in range(64)]
        sizes = []
        for i in range(2):
            replica = svc.replica(i)
            assert replica is not None
            sizes.append(await replica.sizes_seen.call_one())
        assert sum(map(sum, sizes)) == 64
        assert sum(map(len, sizes)) <= 12, sizes  # batched, not 64 invocations
    finally:
        await svc.stop()


def test_bad_batch_settings_fail_at_the_class() -> None:
    with pytest.raises(ValueError):
        zmesh.endpoint(batch=-1)(lambda self, xs: xs)

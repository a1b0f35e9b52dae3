"""An actor's mailbox is bounded by bytes as well as by count.

A caller floods a busy actor with 1 MiB calls. The proc reads no further
once its mailboxes hold ``ZMESH_PROC_MAX_BACKLOG_BYTES`` (here 16 MiB), so
the actor's queue never holds more than that, the proc's RSS stays under a
stated bound, the caller meets backpressure (its calls wait in order, or
fail with ``OverloadedError`` under ``block=False``), and once the actor
moves again every call resolves, in order.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import anyio
import pytest

import zmesh
from zmesh._client.calls import connections as _connections
from zmesh._client.calls import runtime as _runtime
from zmesh._wire import messages as w

pytestmark = [pytest.mark.stress, pytest.mark.anyio]

MiB = 1 << 20
BOUND = 16 * MiB  # the proc's mailbox bytes
IN_FLIGHT = 48 * MiB  # the caller's bytes in flight on one connection
CALLS = 200  # 200 MiB, were they all to pile up in the proc


class Gate(zmesh.Actor):
    def __init__(self) -> None:
        self.until = 0.0
        self.seen: list[int] = []

    @zmesh.endpoint
    async def close_for(self, seconds: float) -> None:
        """Calls to ``take`` wait for ``seconds`` from now: the rest queue meanwhile.

        (Not a message that opens it: a proc that stops reading reads no such message.)
        """
        self.until = time.monotonic() + seconds

    @zmesh.endpoint
    async def take(self, i: int, blob: bytes) -> int:
        await asyncio.sleep(max(0.0, self.until - time.monotonic()))
        self.seen.append(i)
        return len(blob)

    @zmesh.endpoint
    async def order(self) -> list[int]:
        return self.seen


async def _aw(fut: zmesh.Future[int]) -> int:
    return await fut


async def _proc_stats(mesh: Any) -> Any:
    rt, _ = _runtime.current()
    agent = rt.controller.agents[mesh._refs[0].agent]
    reply = await agent.request(w.GetStats)
    return next((p for p in reply.stats.procs if p.mesh == mesh.proc_mesh), None)


async def test_a_flooded_actor_holds_at_most_its_mailbox_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ZMESH_PROC_MAX_BACKLOG_BYTES", str(BOUND))  # procs take ZMESH_*
    monkeypatch.setattr(_connections, "MAX_IN_FLIGHT_BYTES", IN_FLIGHT)
    mesh = await Gate.options().as_actor()
    try:
        first = await _proc_stats(mesh)
        deadline = time.monotonic() + 10
        while first is None or not first.rss:
            assert time.monotonic() < deadline, "no proc statistics"
            await asyncio.sleep(0.2)
            first = await _proc_stats(mesh)
        blob = b"b" * MiB
        await mesh.close_for.call_one(6.0)
        calls = [asyncio.ensure_future(_aw(mesh.take.call_one(i, blob))) for i in range(CALLS)]
        # The caller meets backpressure: over its bytes in flight, block=False fails at once.
        await asyncio.sleep(0)
        with pytest.raises(zmesh.OverloadedError):
            await mesh.take.options(block=False).call_one(-1, blob)
        # The proc's own account, while everything waits: never past the bound.
        peak_rss, peak_queue, peak_bytes = 0, 0, 0
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            stats = await _proc_stats(mesh)
            if stats is not None and stats.actors:
                peak_rss = max(peak_rss, stats.rss)
                peak_queue = max(peak_queue, max(a.queue_peak for a in stats.actors))
                peak_bytes = max(peak_bytes, stats.backlog_bytes)
            await asyncio.sleep(0.3)
        grew = peak_rss - first.rss
        print(f"queue peak {peak_queue}, backlog {peak_bytes / MiB:.1f} MiB, RSS +{grew / MiB:.0f}")
        assert 0 < peak_bytes <= BOUND + MiB + 4096, peak_bytes
        assert 0 < peak_queue <= BOUND // MiB + 1, peak_queue
        assert grew < IN_FLIGHT + BOUND + 32 * MiB, f"the proc grew {grew / MiB:.0f} MiB"
        with anyio.fail_after(60):
            sizes = await asyncio.gather(*calls)
        assert sizes == [MiB] * CALLS
        assert await mesh.order.call_one() == list(range(CALLS))
    finally:
        await mesh.stop()

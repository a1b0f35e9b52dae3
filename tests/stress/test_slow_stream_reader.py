"""A slow reader of a service stream never gets its replica replaced.

A reader of a service's stream that stops reading for a while (its user
paused, its own consumer is slow) holds the producer back: flow control
makes the replica wait for credit. The replica answers nothing meanwhile,
so the service took the reader's pause for the replica's silence: after
``request_timeout`` it was ``UNREADY`` ("no answer ... with 1 in flight"),
after ``unready_timeout`` more it was replaced, and the stream broke with
``StreamInterruptedError`` (with the defaults, a pause of 90 s). A producer
waiting for credit tells its reader it is there (``StreamAlive``, every
quarter of a second): that is the replica's progress, the pause the reader's.

Real replica procs; the timeouts are 1 s here instead of 60 s and 30 s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

import zmesh

pytestmark = [pytest.mark.anyio, pytest.mark.stress]

PAUSE = 4.0  # the reader's pause: past request_timeout + unready_timeout (2 s)


class Tokens(zmesh.Actor):
    @zmesh.endpoint
    async def tokens(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i


async def test_a_reader_that_pauses_keeps_its_stream_and_its_replica() -> None:
    svc: Any = await Tokens.options(
        replicas=1, request_timeout=1.0, unready_timeout=1.0, health_interval=0.1
    ).as_service()
    try:
        states: set[str] = set()
        got = []
        async for x in svc.tokens.options(window=8)(100):
            got.append(x)
            if len(got) == 10:
                for _ in range(int(PAUSE / 0.05)):  # the reader is busy elsewhere
                    states.add(svc.statistics().replicas[0].state)
                    await asyncio.sleep(0.05)
        assert got == list(range(100))
        stats = svc.statistics().replicas[0]
        assert (stats.state, stats.generation, stats.restarts) == ("HEALTHY", 1, 0), stats
        assert states == {"HEALTHY"}, states
    finally:
        await svc.stop()

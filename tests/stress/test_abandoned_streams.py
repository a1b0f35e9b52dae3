"""Thousands of streams opened and dropped before they start never wedge their actor.

A client opens 6,000 streams of one actor's endless generator endpoint (one
at a time per actor: all but the first wait in its mailbox), reads one
item of the first, and drops them all. Each dropped stream's ``Cancel``
reaches the proc before its call starts, and the proc remembers it so that
the call is skipped when its turn comes. It remembered 4,096 at most: the
oldest cancels were forgotten, so those streams started with a reader that
was still connected but no longer reading, sent a window of items into the
void, and waited for credit for ever. The actor never served its next
message (a plain call timed out after 60 s). Now the proc remembers as many
cancels as it may hold queued calls (its backlog bound).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator

import pytest

import zmesh

pytestmark = [pytest.mark.anyio, pytest.mark.stress]

STREAMS = 6000


class Endless(zmesh.Actor):
    def __init__(self) -> None:
        self.started = 0
        self.closed = 0

    @zmesh.endpoint
    async def numbers(self) -> AsyncIterator[int]:
        self.started += 1
        try:
            i = 0
            while True:
                i += 1
                yield i
        finally:
            self.closed += 1

    @zmesh.endpoint
    async def counts(self) -> tuple[int, int]:
        return self.started, self.closed


async def test_streams_dropped_before_they_start_are_skipped_and_the_actor_serves_on() -> None:
    mesh = await Endless.options().as_actor()
    try:
        streams = [mesh.numbers.call_one() for _ in range(STREAMS)]
        async for _ in streams[0]:
            break
        await asyncio.sleep(0.5)  # (every StreamCall reaches the proc's mailbox)
        del streams
        gc.collect()  # every stream dropped: each sends its Cancel
        t0 = time.monotonic()
        started, closed = await mesh.counts.options(timeout=30).call_one()
        # The first stream ran and closed; every other one was skipped, not run.
        assert (started, closed) == (1, 1), (started, closed)
        assert time.monotonic() - t0 < 30
    finally:
        await mesh.stop()

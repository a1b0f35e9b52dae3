"""Stalled streams must not make their proc deaf to everything else.

A producer out of credit checks every ``PROBE_INTERVAL`` that its consumer is
still there by sending it a ``StreamAlive``. ZeroMQ's ``ZMQ_FD`` is
edge-triggered and any send may consume the edge of input that arrived
meanwhile, so a send that does not re-check the socket's events leaves
messages unread until something else wakes the proc. With many stalled
streams the probes come often; calls to the same proc must all be answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

import zmesh

pytestmark = [pytest.mark.anyio, pytest.mark.stress]


class Stalls(zmesh.Actor):
    @zmesh.endpoint(concurrent=True, window=1)
    async def forever(self) -> AsyncIterator[int]:
        i = 0
        while True:
            yield i
            i += 1

    @zmesh.endpoint(concurrent=True)
    async def ping(self, x: int) -> int:
        return x


async def test_calls_are_answered_while_many_streams_wait_for_credit() -> None:
    mesh: Any = await Stalls.options().as_actor()
    try:
        # 64 streams that read one item and stop: each producer probes 4x a second.
        streams = [mesh.forever.call_one() for _ in range(64)]
        for s in streams:
            assert await s.__anext__() == 0
        loop = asyncio.get_running_loop()
        end = loop.time() + 6.0
        n = 0
        while loop.time() < end:
            # A lost wake-up leaves the call unread for as long as nothing else
            # arrives; the timeout turns that into a failure, not a hang.
            assert await mesh.ping.options(timeout=2.0).call_one(n) == n
            n += 1
        assert n > 100
        for s in streams:
            await s.aclose()
    finally:
        await mesh.stop()

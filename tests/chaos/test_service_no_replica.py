"""A fan-out to a service with no healthy replica is never an empty success.

``svc.ep.call()``, ``.stream()`` and ``.broadcast()`` go to the replicas
healthy when they start. With none (every replica killed, or RECOVERING),
they used to answer ``[]`` at once, and a broadcast went nowhere. Now they
wait for a replica within the request timeout, or raise ``ServiceError``.
Real replica procs, killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest

import zmesh

from _helpers import replica_pids, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.chaos, pytest.mark.stress]


class Echo(zmesh.Actor):
    def __init__(self) -> None:
        self.heard: list[str] = []

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()

    @zmesh.endpoint
    async def hear(self, word: str) -> None:
        self.heard.append(word)

    @zmesh.endpoint
    async def heard_words(self) -> list[str]:
        return list(self.heard)


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


def none_healthy(svc: Any) -> bool:
    return all(r.state != "HEALTHY" for r in svc.statistics().replicas)


async def test_a_fan_out_right_after_every_replica_is_killed_waits_for_them() -> None:
    svc: Any = await Echo.options(replicas=2, backoff_initial=0.05, max_restarts=20).as_service()
    try:
        for _ in range(3):  # each round: kill every replica, fan out at once
            await wait_until(lambda: svc.statistics().state == "OK", 20.0, "every replica back")
            before = await replica_pids(svc)
            kill_all(before)
            pids = await svc.pid.options(timeout=20.0).call()
            # (every replica healthy when the fan-out starts: the first one back, or both)
            assert pids and not set(pids) & set(before), pids
            # A stream and a broadcast made while every replica is down.
            await wait_until(lambda: svc.statistics().state == "OK", 20.0, "every replica back")
            before = await replica_pids(svc)
            kill_all(before)
            await wait_until(lambda: none_healthy(svc), 10.0, "the kills seen")
            svc.hear.broadcast("while down")
            streamed = [p async for p in svc.pid.options(timeout=20.0).stream()]
            assert streamed and not set(streamed) & set(before), streamed
            # The broadcast went to the replica(s) back first, once they were.
            heard = await svc.heard_words.call()
            for _ in range(100):  # (a broadcast has no reply: it lands soon after)
                if ["while down"] in heard:
                    break
                await asyncio.sleep(0.05)
                heard = await svc.heard_words.call()
            assert ["while down"] in heard and all(h in ([], ["while down"]) for h in heard)
        await wait_until(lambda: svc.statistics().state == "OK", 20.0, "every replica back")
    finally:
        await svc.stop()


async def test_a_fan_out_to_a_recovering_service_raises_service_error_in_its_timeout() -> None:
    # Respawns wait 3 s: the service stays RECOVERING longer than the calls' timeout.
    svc: Any = await Echo.options(replicas=2, backoff_initial=3.0).as_service()
    try:
        kill_all(await replica_pids(svc))
        await wait_until(lambda: none_healthy(svc), 10.0, "the kills seen")
        assert {r.state for r in svc.statistics().replicas} == {"RECOVERING"}
        t0 = time.monotonic()
        with pytest.raises(zmesh.ServiceError, match=r"no replica .* became healthy"):
            await svc.pid.options(timeout=0.5).call()
        with pytest.raises(zmesh.ServiceError, match=r"no replica .* became healthy"):
            async for _ in svc.pid.options(timeout=0.5).stream():
                pass
        took = time.monotonic() - t0
        assert 0.9 < took < 3.0, took  # waited its timeout (twice), no more
        # A call given time enough waits for the first replica back.
        assert len(await svc.pid.options(timeout=20.0).call()) >= 1
    finally:
        await svc.stop()


async def test_a_fan_out_to_a_down_service_raises_at_once() -> None:
    svc: Any = await Echo.options(replicas=2, max_restarts=0).as_service()
    try:
        kill_all(await replica_pids(svc))
        await wait_until(lambda: svc.statistics().state == "DOWN", 10.0, "the service DOWN")
        t0 = time.monotonic()
        with pytest.raises(zmesh.ServiceError, match="DOWN"):
            await svc.pid.call()
        with pytest.raises(zmesh.ServiceError, match="DOWN"):
            async for _ in svc.pid.stream():
                pass
        with pytest.raises(zmesh.ServiceError, match="DOWN"):
            svc.hear.broadcast("nobody")
        assert time.monotonic() - t0 < 2.0
    finally:
        await svc.stop()

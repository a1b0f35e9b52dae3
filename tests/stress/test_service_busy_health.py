"""A health check never kills a replica for being busy.

An LLM-style service: each request sleeps a while in an ``async def``
endpoint (one at a time per replica), 100 requests at once on 2 replicas,
some of them streamed, with a ``concurrent`` ``__health__`` polled often and
given little time. The check used to wait behind the queue, so busy
replicas were declared dead, killed and respawned: requests ran again,
streams broke with ``StreamInterruptedError`` and the service ended DOWN.
Now the check runs beside the mailbox, a silent check counts only without
progress, and a failing check means "route elsewhere" (``UNREADY``), not
"kill"; a replica that is truly wedged is replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import zmesh

from _helpers import wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.stress]


class Model(zmesh.Actor):
    def __init__(self, slow_check_when_busy: bool = False) -> None:
        self.sick = False
        self.slow_check_when_busy = slow_check_when_busy
        self.busy = 0

    @zmesh.endpoint
    async def generate(self, prompt: int) -> tuple[int, int]:
        self.busy += 1
        try:
            await asyncio.sleep(random.uniform(0.03, 0.12))  # "decoding"
        finally:
            self.busy -= 1
        return prompt, os.getpid()

    @zmesh.endpoint
    async def tokens(self, prompt: int) -> AsyncIterator[int]:
        for i in range(3):
            await asyncio.sleep(random.uniform(0.01, 0.04))
            yield prompt * 10 + i

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()

    @zmesh.endpoint
    async def set_sick(self, sick: bool) -> None:
        self.sick = sick

    @zmesh.endpoint
    async def wedge(self) -> None:
        time.sleep(3600)  # blocks the proc's event loop: nothing runs there any more

    @zmesh.endpoint
    async def hang(self) -> None:
        await asyncio.Event().wait()  # the loop runs on (checks pass), this actor never answers

    @zmesh.endpoint(concurrent=True)
    async def __health__(self) -> bool:
        if self.busy and self.slow_check_when_busy:
            await asyncio.sleep(1.0)  # (longer than health_timeout: no reply in time)
        if self.sick:
            raise RuntimeError("model weights corrupted")
        return True


SETTINGS: dict[str, Any] = dict(
    replicas=2, health_interval=0.2, health_timeout=0.2, request_timeout=30.0, max_restarts=1
)


@pytest.mark.parametrize("slow_check", [False, True], ids=["check", "silent_check"])
async def test_a_busy_llm_style_service_keeps_its_replicas(slow_check: bool) -> None:
    # silent_check: the check gets no reply in time while requests complete (busy, not dead).
    svc: Any = await Model.options(**SETTINGS).as_service(slow_check)
    try:
        calls = [svc.generate(i) for i in range(80)]
        streams = [svc.tokens(i) for i in range(80, 100)]

        async def read(stream: Any) -> list[int]:
            return [t async for t in stream]

        states: set[str] = set()

        async def watch() -> None:
            while True:
                stats = svc.statistics()
                states.add(stats.state)
                states.update(r.state for r in stats.replicas)
                await asyncio.sleep(0.05)

        watcher = asyncio.ensure_future(watch())
        t0 = time.monotonic()
        answers = await asyncio.gather(*calls)
        items = await asyncio.gather(*(read(s) for s in streams))
        watcher.cancel()
        assert [p for p, _ in answers] == list(range(80))  # every request answered, once
        assert len({pid for _, pid in answers}) == 2
        assert items == [[p * 10, p * 10 + 1, p * 10 + 2] for p in range(80, 100)]
        assert time.monotonic() - t0 > 1.0  # (the queues were long: many checks ran)
        stats = svc.statistics()
        assert states == {"OK", "HEALTHY"}, states
        assert (stats.state, stats.retried, stats.failed) == ("OK", 0, 0), stats
        for r in stats.replicas:
            assert (r.state, r.generation, r.restarts, r.retried) == ("HEALTHY", 1, 0, 0), r
    finally:
        await svc.stop()


async def test_a_failing_check_routes_elsewhere_and_a_passing_one_brings_it_back() -> None:
    svc: Any = await Model.options(**SETTINGS).as_service()
    try:
        sick_pid = await svc.replica(0).pid.call_one()
        await svc.replica(0).set_sick.call_one(True)
        # UNREADY for its check's own error. (Under load a check can also miss
        # its 0.2 s first, which is UNREADY too, for that reason: the next
        # checks, which raise, then say why.)
        await wait_until(
            lambda: (
                (r := svc.statistics().replicas[0]).state == "UNREADY"
                and "model weights corrupted" in r.last_failure
            ),
            10.0,
            "replica 0 UNREADY for its failing check",
        )
        assert svc.statistics().replicas[0].generation == 1
        assert {pid for _, pid in await asyncio.gather(*(svc.generate(i) for i in range(20)))} == {
            await svc.replica(1).pid.call_one()
        }  # routed elsewhere
        assert svc.statistics().state == "DEGRADED"
        await svc.replica(0).set_sick.call_one(False)  # not killed: it is still there
        await wait_until(lambda: svc.statistics().state == "OK", 10.0, "replica 0 back")
        assert await svc.replica(0).pid.call_one() == sick_pid
        assert [(r.generation, r.restarts) for r in svc.statistics().replicas] == [(1, 0)] * 2
    finally:
        await svc.stop()


@pytest.mark.chaos
@pytest.mark.parametrize("how", ["blocked_loop", "sigstop"])
async def test_a_wedged_replica_is_replaced(how: str) -> None:
    svc: Any = await Model.options(**SETTINGS, unready_timeout=1.0).as_service()
    pid = await svc.replica(0).pid.call_one()
    try:
        if how == "sigstop":
            os.kill(pid, signal.SIGSTOP)
        else:
            svc.replica(0).wedge.broadcast()
        t0 = time.monotonic()
        await wait_until(
            lambda: (
                svc.statistics().replicas[0].generation == 2
                and svc.statistics().replicas[0].state == "HEALTHY"
            ),
            15.0,
            "the wedged replica replaced",
        )
        assert time.monotonic() - t0 < 8.0
        assert await svc.replica(0).pid.call_one() != pid
        answers = await asyncio.gather(*(svc.generate(i) for i in range(10)))
        assert [p for p, _ in answers] == list(range(10))
    finally:
        if how == "sigstop":
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        await svc.stop()


async def test_a_replica_silent_with_work_is_unready_then_replaced_but_idle_is_not_silent() -> None:
    settings = {**SETTINGS, "request_timeout": 1.0, "unready_timeout": 1.0}
    svc: Any = await Model.options(**settings).as_service()
    try:
        await asyncio.sleep(1.5)  # idle longer than request_timeout: not a stall
        assert [p for p, _ in await asyncio.gather(*(svc.generate(i) for i in range(6)))] == [
            0,
            1,
            2,
            3,
            4,
            5,
        ]
        assert svc.statistics().state == "OK"
        hung = asyncio.ensure_future(svc.hang())  # through the service: its work in flight
        await wait_until(
            lambda: any(r.in_flight for r in svc.statistics().replicas), 5.0, "hang sent"
        )
        (k,) = [r.index for r in svc.statistics().replicas if r.in_flight]
        seen: set[str] = set()

        def replaced() -> bool:
            r = svc.statistics().replicas[k]
            seen.add(r.state)
            return r.generation == 2 and r.state == "HEALTHY"

        await wait_until(replaced, 15.0, "the silent replica replaced")
        assert "UNREADY" in seen, seen
        assert "no answer for" in svc.statistics().replicas[k].last_failure
        with pytest.raises(zmesh.CallTimeoutError):
            await hung  # its caller stopped waiting at request_timeout
        assert svc.statistics().replicas[1 - k].generation == 1  # the other one untouched
    finally:
        await svc.stop()

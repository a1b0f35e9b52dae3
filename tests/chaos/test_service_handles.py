"""A service handle is a value (issue 15 item 3).

Passed to an actor, the handle routes, retries and fails over from inside
that actor's proc, following the replicas' supervision and the
orchestrator's replica table through the agents; returned from an actor, it
is the owner's service again. Real procs and a real SIGKILL.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest

import zmesh

from _actors import Worker, expected

pytestmark = [pytest.mark.chaos, pytest.mark.anyio]


class Trainer(zmesh.Actor):
    """Calls the service it was given, from its own proc."""

    def __init__(self, svc: zmesh.Service) -> None:
        self.svc = svc

    @zmesh.endpoint
    async def run(self, n: int, concurrency: int) -> dict[str, Any]:
        sem = asyncio.Semaphore(concurrency)
        wrong: list[int] = []
        errors: list[str] = []

        async def one(i: int) -> None:
            async with sem:
                try:
                    value = await self.svc.work.options(timeout=30)(i)
                except Exception as exc:
                    errors.append(repr(exc))
                    return
                if value != expected(i):
                    wrong.append(i)

        await asyncio.gather(*(one(i) for i in range(n)))
        stats = self.svc.statistics()
        return {
            "wrong": wrong,
            "errors": errors,
            "generations": [r.generation for r in stats.replicas],
            "retried": stats.retried,
            "sent_after_failure": sum(r.sent_after_failure for r in stats.replicas),
        }

    @zmesh.endpoint
    async def generations(self) -> list[int]:
        return [r.generation for r in self.svc.statistics().replicas]

    @zmesh.endpoint
    async def handle(self) -> zmesh.Service:
        return self.svc


async def wait_until(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await cond():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.05)


async def test_a_handle_inside_an_actor_fails_over_with_nothing_lost() -> None:
    svc = await Worker.options(replicas=3, backoff_initial=0.1).spawn()
    trainer = await Trainer.options().spawn(svc)
    try:
        first = await trainer.run(30, 10)  # the handle works from the trainer's proc
        assert first["errors"] == [] and first["wrong"] == []
        replica = svc.replica(0)
        assert replica is not None
        victim = await replica.pid.call_one()
        # 3000 calls of 10 ms, 20 at a time: at least 1.5 s, so the kill lands mid-run.
        running = trainer.run.options(timeout=120).call_one(3000, 20)
        await asyncio.sleep(0.5)
        os.kill(victim, signal.SIGKILL)
        result = await running
        assert result["errors"] == [], result["errors"][:5]  # 0 lost
        assert result["wrong"] == []
        assert result["sent_after_failure"] == 0
        assert result["retried"] >= 1  # the kill hit requests in flight: re-sent
        # The trainer's handle followed the orchestrator to the new generation.
        await wait_until(
            lambda: _gen0(trainer), 30, "the trainer's handle sees replica 0 in generation 2"
        )
        again = await trainer.run(60, 10)
        assert again["errors"] == [] and again["wrong"] == []
        # Returned from the actor, it is the owner's service again.
        back = await trainer.handle.call_one()
        assert isinstance(back, zmesh.Service)
        assert getattr(back, "id") == getattr(svc, "id")  # noqa: B009  (typed as a Worker)
        assert await back.work(3) == expected(3)
        assert back.statistics().state == "OK"
    finally:
        await trainer.stop()
        await svc.stop()


async def _gen0(trainer: Any) -> bool:
    gens = await trainer.generations.call_one()
    return bool(gens[0] >= 2)

"""A ``__health__`` check that never returns costs its replica nothing that grows.

The supervisor sends a check every ``health_interval``, whether or not the
last one answered (a check that gets no reply in time counts only without
progress, so a busy replica is kept). A check that hangs for ever (a
deadlocked lock, an await on something that never comes) used to leave one
more task, or for a ``def`` check one more worker thread, in the replica's
proc per check: at the default interval 3,600 an hour, each counted in the
proc's backlog, until the pool's 1,024 threads were all stuck and every
sync endpoint of the replica waited behind them. Now at most one check of
an actor runs at a time and one more waits for it (a newer one replaces it,
and the replaced caller gets ``CallTimeoutError`` as if no reply came).

Real replica procs; the checks arrive every 50 ms here, 20 times the default.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import zmesh

from _helpers import wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.stress]

# Checks every 50 ms (20x the default rate), each given 0.5 s: a busy
# replica must answer some request within that window to count as making
# progress, and on 2 loaded cores a proc can wait over 0.1 s for a CPU (it
# failed so once at 0.1 s, the replica judged UNREADY while its requests
# were still being served).
SETTINGS: dict[str, Any] = dict(
    replicas=1, health_interval=0.05, health_timeout=0.5, request_timeout=10.0,
    unready_timeout=3.0, max_restarts=1,
)  # fmt: skip


class Hangs(zmesh.Actor):
    """A replica whose health check never returns (async, or sync in a worker thread)."""

    def __init__(self) -> None:
        self.checks = 0  # checks started: none of them ends

    @zmesh.endpoint
    async def work(self, i: int) -> int:
        await asyncio.sleep(0.01)
        return i

    @zmesh.endpoint
    def sync_work(self, i: int) -> int:
        return i

    @zmesh.endpoint(concurrent=True)
    async def started_checks(self) -> tuple[int, int, int]:
        return self.checks, len(asyncio.all_tasks()), threading.active_count()


class AsyncHangs(Hangs):
    @zmesh.endpoint
    async def __health__(self) -> bool:
        self.checks += 1
        await asyncio.Event().wait()
        return True


class SyncHangs(Hangs):
    @zmesh.endpoint
    def __health__(self) -> bool:
        self.checks += 1
        threading.Event().wait()
        return True


@pytest.fixture(params=[AsyncHangs, SyncHangs], ids=["async_check", "sync_check"])
async def svc(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    service: Any = await request.param.options(**SETTINGS).as_service()
    yield service
    await service.stop()


async def test_a_check_that_never_returns_leaves_nothing_behind_while_requests_complete(
    svc: Any,
) -> None:
    t0 = time.monotonic()
    done = 0
    while time.monotonic() - t0 < 3.0:  # ~60 checks sent meanwhile
        got = await asyncio.gather(*(svc.work(i) for i in range(5)), svc.sync_work(7))
        assert got == [0, 1, 2, 3, 4, 7]
        done += 6
        stats = svc.statistics()
        # Busy is not dead: the silent check never makes it UNREADY, let alone replaced.
        assert stats.replicas[0].state == "HEALTHY", stats
    checks, tasks, threads = await svc.replica(0).started_checks.options(timeout=10).call_one()
    stats = svc.statistics()
    assert (stats.replicas[0].generation, stats.replicas[0].restarts) == (1, 0), stats
    assert checks == 1, (
        f"{checks} hung health checks run in the replica (tasks {tasks}, threads {threads})"
    )
    assert done > 30


async def test_an_idle_replica_whose_check_never_returns_is_still_unready(svc: Any) -> None:
    # Without progress a silent check is what a hung replica looks like: out of routing.
    await wait_until(
        lambda: svc.statistics().replicas[0].state == "UNREADY", 10.0, "the replica UNREADY"
    )
    assert "no reply" in svc.statistics().replicas[0].last_failure

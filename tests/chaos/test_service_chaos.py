"""Services under real failures: replicas' procs killed with SIGKILL.

Every test signals only procs of its own service, by the pid the proc itself
reports (``svc.replica(i).pid``), waits on conditions with deadlines, and
stops its service at the end (and the autouse fixture in conftest calls
``zmesh.shutdown()``).

Measured latencies are printed (``pytest -s`` shows them) as ``LATENCY ...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import zmesh

import _actors
from _actors import expected
from _helpers import latency, outcome, pid_alive, replica_pids, session_pids, wait_gone, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.anyio]


class Worker(_actors.Worker, _actors.Napper):
    @zmesh.endpoint(concurrent=True, retry=False)
    async def nap_once(self, seconds: float) -> int:
        await asyncio.sleep(seconds)
        return os.getpid()

    @zmesh.endpoint(concurrent=True)
    async def record(self, path: str, seconds: float) -> str:
        """Write down this delivery of the request (id and pid), then take a while."""
        request = zmesh.current_request()
        with open(path, "a") as f:
            f.write(f"{request} {os.getpid()}\n")
        await asyncio.sleep(seconds)
        return request


# ------------------------------------------------------------ helpers


@contextlib.asynccontextmanager
async def running(cls: type[zmesh.Actor], **options: Any) -> AsyncIterator[Any]:
    """A service of ``cls`` for the block; stopped at the end."""
    svc = await cls.options(**options).as_service()
    try:
        yield svc
    finally:
        await svc.stop()


def replica(svc: Any, i: int) -> zmesh.routing.ReplicaStatistics:
    return svc.statistics().replicas[i]


def healthy_at(svc: Any, i: int, generation: int) -> bool:
    """Whether replica ``i`` is healthy in ``generation``."""
    return (replica(svc, i).generation, replica(svc, i).state) == (generation, "HEALTHY")


def all_healthy(svc: Any) -> bool:
    return all(r.state == "HEALTHY" for r in svc.statistics().replicas)


def spread(values: Sequence[Any]) -> int:
    counts = Counter(values).values()
    return max(counts) - min(counts)


def no_send_after_failure(svc: Any) -> None:
    for r in svc.statistics().replicas:
        assert r.sent_after_failure == 0, r


# ------------------------------------------------------------ steady load


@pytest.mark.slow
async def test_steady_load_with_a_replica_killed_every_2s() -> None:
    rate, duration = 300, 20.0  # requests per second, seconds
    async with running(Worker, replicas=3, max_restarts=10) as svc:
        calls: list[asyncio.Future[tuple[float, bool, Any]]] = []
        sent_at: list[float] = []
        killed: list[tuple[float, int, int]] = []  # (when, replica, pid)
        start = time.monotonic()
        stop_at = start + duration

        async def load() -> None:
            while (now := time.monotonic()) < stop_at:
                while len(calls) < int((now - start) * rate):
                    i = len(calls)
                    sent_at.append(time.monotonic())
                    calls.append(asyncio.ensure_future(outcome(svc.work.call_one(i))))
                await asyncio.sleep(0.004)

        async def killer() -> None:
            turn = 0
            while time.monotonic() + 2.0 < stop_at:
                await asyncio.sleep(2.0)  # the pace of the chaos, not a wait for a condition
                healthy = [r.index for r in svc.statistics().replicas if r.state == "HEALTHY"]
                if not healthy:
                    continue
                i = healthy[turn % len(healthy)]
                turn += 1
                try:
                    pid = await svc.replica(i).pid.options(timeout=5).call_one()
                except zmesh.ZmeshError as err:  # it failed by itself meanwhile
                    print(f"\nreplica {i} failed before its kill: {err}")
                    continue
                os.kill(pid, signal.SIGKILL)
                killed.append((time.monotonic() - start, i, pid))

        await asyncio.gather(load(), killer())
        sent = len(calls)
        _, pending = await asyncio.wait(calls, timeout=30.0)
        assert not pending, f"{len(pending)} of {sent} requests hung"
        results = [c.result() for c in calls]
        errors = [(i, v) for i, (_, ok, v) in enumerate(results) if not ok]
        assert not errors, f"{len(errors)} requests lost, e.g. {errors[:3]}"
        wrong = [(i, v) for i, (_, _, v) in enumerate(results) if v != expected(i)]
        assert not wrong, f"wrong results: {wrong[:5]}"
        slowest = max(t - sent_at[i] for i, (t, _, _) in enumerate(results))

        await wait_until(lambda: all_healthy(svc), 30.0, "every replica healthy again")
        stats = svc.statistics()
        print(
            f"\nsent {sent} ({sent / duration:.0f}/s), lost 0, retried {stats.retried}, "
            f"kills {[(round(t, 1), i) for t, i, _ in killed]}, slowest {slowest:.3f} s"
        )
        for r in stats.replicas:
            print(
                f"  replica {r.index}: {r.state} gen {r.generation} restarts {r.restarts} "
                f"completed {r.completed} retried {r.retried} p50 {r.p50} p99 {r.p99}"
            )
        assert sent >= 200 * duration
        assert len(killed) >= 8
        assert stats.state == "OK"
        assert stats.completed == sent
        assert stats.failed == 0
        assert stats.retried > 0, "no kill hit a request in flight"
        # every kill was a restart (a loaded machine may add one, e.g. an owner
        # heartbeat starved past ZMESH_OWNER_GRACE: the failure is then not ours)
        assert sum(r.restarts for r in stats.replicas) >= len(killed)
        for r in stats.replicas:
            assert r.generation == 1 + r.restarts
            assert r.restarts >= sum(1 for _, i, _ in killed if i == r.index)
        no_send_after_failure(svc)
        assert not any(pid_alive(pid) for _, _, pid in killed)


# ------------------------------------------------------------ routing around failures


async def test_router_skips_a_dead_replica() -> None:
    async with running(Worker, replicas=3, backoff_initial=3.0) as svc:
        pids = await replica_pids(svc)
        assert {await svc.pid.call_one() for _ in range(9)} == set(pids)
        t0 = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        took = await wait_until(
            lambda: replica(svc, 1).state != "HEALTHY", 2.0, "the dead replica out of routing"
        )
        latency("kill -9 -> replica out of routing", took)
        before = replica(svc, 1)
        assert before.state == "RECOVERING" and before.generation == 1

        results = await asyncio.gather(*(outcome(svc.pid.call_one()) for _ in range(50)))
        assert all(ok for _, ok, _ in results), [v for _, ok, v in results if not ok]
        landed = [v for _, _, v in results]
        assert set(landed) == {pids[0], pids[2]}
        after = svc.statistics()
        r1 = after.replicas[1]
        assert r1.generation == 1, "respawned too soon for this test: raise backoff_initial"
        assert r1.sent == before.sent  # nothing sent to it after its event
        assert (r1.sent_after_failure, r1.failed, r1.retried) == (0, 0, 0)
        assert after.failed == 0 and after.retried == 0
        assert after.state == "DEGRADED"
        assert "SIGKILL" in r1.last_failure

        # it comes back (generation 2) and takes its turn again
        await wait_until(
            lambda: replica(svc, 1).generation == 2 and replica(svc, 1).state == "HEALTHY",
            15.0,
            "replica 1 respawned",
        )
        assert time.monotonic() - t0 >= 3.0  # not before its backoff
        fresh = await replica_pids(svc)
        assert fresh[0] == pids[0] and fresh[2] == pids[2] and fresh[1] != pids[1]
        assert {await svc.pid.call_one() for _ in range(9)} == set(fresh)
        assert svc.statistics().state == "OK"
        no_send_after_failure(svc)


@pytest.mark.slow
async def test_round_robin_stays_even_while_the_healthy_set_changes() -> None:
    async with running(Worker, replicas=3, backoff_initial=3.0) as svc:
        pids = await replica_pids(svc)

        def check(order: list[int], members: set[int]) -> None:
            assert set(order) == members, order
            assert spread(order) <= 1, Counter(order)
            n = len(members)
            # no replica twice in any turn: the rotation does not drift
            for k in range(len(order) - n + 1):
                assert len(set(order[k : k + n])) == n, order

        check([await svc.pid.call_one() for _ in range(30)], set(pids))

        os.kill(pids[1], signal.SIGKILL)
        await wait_until(lambda: replica(svc, 1).state != "HEALTHY", 2.0, "replica 1 down")
        check([await svc.pid.call_one() for _ in range(30)], {pids[0], pids[2]})

        await wait_until(
            lambda: replica(svc, 1).generation == 2 and all_healthy(svc), 15.0, "replica 1 back"
        )
        fresh = await replica_pids(svc)
        check([await svc.pid.call_one() for _ in range(30)], set(fresh))

        # and with calls in flight together, while a replica leaves
        os.kill(fresh[2], signal.SIGKILL)
        await wait_until(lambda: replica(svc, 2).state != "HEALTHY", 2.0, "replica 2 down")
        together = await asyncio.gather(*(svc.pid.call_one() for _ in range(40)))
        assert set(together) == {fresh[0], fresh[1]} and spread(together) <= 1
        no_send_after_failure(svc)


# ------------------------------------------------------------ sessions


async def test_session_rebinds_when_its_replica_dies() -> None:
    async with running(Worker, replicas=3, backoff_initial=3.0) as svc:
        async with svc.session() as s:
            first = {await svc.pid.call_one() for _ in range(5)}
            assert len(first) == 1
            (victim,) = first
            bound = s.replica
            assert bound is not None and s.rebinds == 0

            os.kill(victim, signal.SIGKILL)
            t0 = time.monotonic()
            moved = await svc.pid.options(timeout=10).call_one()  # no error for the caller
            latency("session call right after its replica was killed", time.monotonic() - t0)
            assert moved != victim
            assert s.rebinds == 1
            assert s.replica is not None and s.replica != bound
            assert {await svc.pid.call_one() for _ in range(10)} == {moved}
            assert s.rebinds == 1
        no_send_after_failure(svc)


# ------------------------------------------------------------ retries


async def test_retry_false_gets_supervision_error_and_retried_requests_keep_their_id(
    tmp_path: Path,
) -> None:
    path = tmp_path / "deliveries.txt"
    async with running(Worker, replicas=2, backoff_initial=3.0) as svc:
        async with svc.session() as s:
            victim = await svc.pid.call_one()  # the session's replica
            once = asyncio.ensure_future(outcome(svc.nap_once.call_one(3.0)))
            again = asyncio.ensure_future(outcome(svc.record.call_one(str(path), 1.0)))
            await wait_until(path.exists, 5.0, "record() started on the session's replica")
            os.kill(victim, signal.SIGKILL)
            t0 = time.monotonic()

            t_once, ok, err = await once
            assert not ok and isinstance(err, zmesh.SupervisionError), err
            assert err.reason == "killed by SIGKILL"
            latency("retry=False request in flight -> SupervisionError", t_once - t0)
            assert t_once - t0 < 2.0

            _, ok, request = await again
            assert ok, request
            assert isinstance(request, str) and request
            assert s.rebinds == 1

        deliveries = [line.split() for line in path.read_text().splitlines()]
        assert [d[0] for d in deliveries] == [request, request]  # the same id, twice
        assert deliveries[0][1] == str(victim) and deliveries[1][1] != str(victim)
        stats = svc.statistics()
        assert stats.retried == 1 and stats.failed == 1
        no_send_after_failure(svc)


async def test_a_replica_fails_whole_when_one_of_its_ranks_dies() -> None:
    async with running(Worker, replicas=2, procs=2) as svc:
        old = (await svc.replica(0).pid.call()).values()
        calls = [asyncio.ensure_future(outcome(svc.nap.call_one(0.5))) for _ in range(10)]
        await wait_until(
            lambda: all(r.in_flight > 0 for r in svc.statistics().replicas), 5.0, "calls on both"
        )
        os.kill(old[1], signal.SIGKILL)  # rank 1 of replica 0
        _, pending = await asyncio.wait(calls, timeout=10.0)
        assert not pending
        assert all(c.result()[1] for c in calls), [c.result()[2] for c in calls]
        await wait_until(
            lambda: replica(svc, 0).generation == 2 and all_healthy(svc), 15.0, "replica 0 back"
        )
        new = (await svc.replica(0).pid.call()).values()
        assert not set(new) & set(old)  # every rank of the replica replaced
        await asyncio.to_thread(wait_gone, old, 10.0)
        stats = svc.statistics()
        assert stats.retried >= 1 and stats.failed == 0
        assert stats.replicas[0].restarts == 1 and stats.replicas[1].restarts == 0
        no_send_after_failure(svc)


# ------------------------------------------------------------ restarts


@pytest.mark.slow
async def test_restart_intensity_limit_leaves_the_replica_down() -> None:
    async with running(
        Worker, replicas=2, max_restarts=2, restart_window=30.0, backoff_initial=0.1
    ) as svc:
        other = await svc.replica(1).pid.call_one()
        for generation in (2, 3):
            pid = await svc.replica(0).pid.call_one()
            os.kill(pid, signal.SIGKILL)
            await wait_until(
                partial(healthy_at, svc, 0, generation),
                15.0,
                f"replica 0 in generation {generation}",
            )
        last = await svc.replica(0).pid.call_one()
        os.kill(last, signal.SIGKILL)
        await wait_until(lambda: replica(svc, 0).state == "UNHEALTHY", 10.0, "replica 0 given up")
        stats = svc.statistics()
        assert stats.state == "DEGRADED"
        r0 = stats.replicas[0]
        assert (r0.restarts, r0.generation) == (2, 3)
        assert "SIGKILL" in r0.last_failure

        # No storm: through many backoff periods, nothing restarts it.
        quiet_until = time.monotonic() + 2.0
        while time.monotonic() < quiet_until:
            r0 = replica(svc, 0)
            assert (r0.state, r0.restarts, r0.generation) == ("UNHEALTHY", 2, 3)
            await asyncio.sleep(0.05)
        assert not pid_alive(last)
        # the other replica serves everything
        assert {await svc.pid.call_one() for _ in range(20)} == {other}
        assert svc.statistics().state == "DEGRADED"
        no_send_after_failure(svc)


@pytest.mark.slow
async def test_no_healthy_replica_calls_wait_then_fail() -> None:
    async with running(Worker, replicas=1, backoff_initial=3.0) as svc:
        pid = await svc.pid.call_one()
        os.kill(pid, signal.SIGKILL)
        await wait_until(lambda: replica(svc, 0).state != "HEALTHY", 2.0, "the replica down")
        assert svc.statistics().state == "DOWN"

        t0 = time.monotonic()
        with pytest.raises(zmesh.ServiceError) as info:
            await svc.pid.options(timeout=0.5).call_one()
        took = time.monotonic() - t0
        latency("no healthy replica, 0.5 s timeout -> ServiceError", took)
        assert not isinstance(info.value, zmesh.ServiceOverloadedError)
        assert 0.45 <= took < 1.5

        t0 = time.monotonic()
        fresh = await svc.pid.options(timeout=30).call_one()  # waits for the recovery
        latency("a call waiting for the only replica to come back", time.monotonic() - t0)
        assert fresh != pid
        stats = svc.statistics()
        assert stats.state == "OK"
        assert (stats.replicas[0].generation, stats.replicas[0].restarts) == (2, 1)
        no_send_after_failure(svc)


# ------------------------------------------------------------ fan-out and stop


async def test_fanout_leaves_out_a_replica_that_dies_during_the_call() -> None:
    async with running(Worker, replicas=3, backoff_initial=3.0) as svc:
        pids = await replica_pids(svc)
        fanout = asyncio.ensure_future(outcome(svc.nap.call(1.0)))
        await wait_until(
            lambda: all(r.in_flight == 1 for r in svc.statistics().replicas), 5.0, "on every one"
        )
        os.kill(pids[1], signal.SIGKILL)
        _, ok, values = await fanout
        assert ok, values
        # one value per replica that answered: not a second one from a survivor
        assert sorted(values) == sorted([pids[0], pids[2]])
        no_send_after_failure(svc)


async def test_stop_during_a_respawn_leaves_no_proc() -> None:
    svc = await Worker.options(replicas=2, backoff_initial=0.05).as_service()
    pids = await replica_pids(svc)
    os.kill(pids[0], signal.SIGKILL)
    await wait_until(lambda: replica(svc, 0).state != "HEALTHY", 2.0, "replica 0 recovering")
    await asyncio.sleep(0.15)  # into the respawn (about 0.2-0.7 s of process start)
    await svc.stop()
    assert [r.state for r in svc.statistics().replicas] == ["STOPPED", "STOPPED"]
    from_this_test = session_pids("proc")
    deadline = time.monotonic() + 10.0
    while from_this_test:
        assert time.monotonic() < deadline, f"procs left after stop(): {from_this_test}"
        await asyncio.sleep(0.05)
        from_this_test = session_pids("proc")


async def test_a_service_whose_every_replica_gave_up_fails_calls_at_once() -> None:
    async with running(Worker, replicas=1, max_restarts=0, request_timeout=30.0) as svc:
        pid = await svc.replica(0).pid.call_one()
        os.kill(pid, signal.SIGKILL)
        await wait_until(lambda: replica(svc, 0).state == "UNHEALTHY", 10.0, "replica 0 given up")
        assert svc.statistics().state == "DOWN"
        t0 = time.monotonic()
        with pytest.raises(zmesh.ServiceError, match="restart limit"):
            await svc.pid.call_one()
        assert time.monotonic() - t0 < 1.0  # not the 30 s request timeout

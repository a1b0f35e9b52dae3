"""Services: replicas, adverbs, routers, sessions, bounded work, health checks.

Real processes on the embedded local agent (and a two-agent cluster for
``hosts=2``); nothing is mocked. Replica processes are never signalled
here: the tests that kill procs are in ``tests/chaos/test_service_chaos.py``.
A ``__health__`` check that fails makes the *service* replace its replica,
which these tests observe through ``statistics()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

import zmesh

from _helpers import pid_alive, replica_pids, wait_gone, wait_until


class Echo(zmesh.Actor):
    """A stateless replica with a few knobs for the tests."""

    def __init__(self, tag: str = "") -> None:
        self.tag = tag
        self.sick = False
        self.hung = False
        self.hits: list[str] = []

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()

    @zmesh.endpoint
    async def double(self, x: int) -> int:
        return 2 * x

    @zmesh.endpoint
    async def whoami(self) -> str:
        return self.tag

    @zmesh.endpoint
    async def hit(self, token: str) -> int:
        """Record ``token`` on this rank; return the rank."""
        self.hits.append(token)
        return zmesh.current_rank().rank

    @zmesh.endpoint
    async def seen(self) -> list[str]:
        return list(self.hits)

    @zmesh.endpoint
    async def fail(self, message: str) -> None:
        raise ValueError(message)

    @zmesh.endpoint(concurrent=True)
    async def nap(self, seconds: float) -> int:
        await asyncio.sleep(seconds)
        return os.getpid()

    @zmesh.endpoint
    async def request_id(self) -> str:
        return zmesh.current_request()

    @zmesh.endpoint
    async def make_sick(self) -> None:
        self.sick = True

    @zmesh.endpoint
    async def make_hung(self) -> None:
        self.hung = True

    @zmesh.endpoint(concurrent=True)
    async def __health__(self) -> bool:
        if self.hung:
            await asyncio.sleep(60)
        return not self.sick


# ------------------------------------------------------------ helpers


@contextlib.asynccontextmanager
async def running(cls: type[zmesh.Actor], *args: Any, **options: Any) -> AsyncIterator[Any]:
    """A service of ``cls`` for the block; stopped at the end."""
    svc = await cls.options(**options).as_service(*args)
    try:
        yield svc
    finally:
        await svc.stop()


def states(svc: Any) -> list[str]:
    return [r.state for r in svc.statistics().replicas]


def spread(values: Sequence[Any]) -> int:
    """max - min of how often each distinct value occurs."""
    counts = Counter(values).values()
    return max(counts) - min(counts)


def assert_clean(svc: Any) -> None:
    """Every replica healthy in its first generation, nothing sent to a failed one."""
    stats = svc.statistics()
    assert stats.state == "OK", stats
    for r in stats.replicas:
        assert (r.state, r.generation, r.restarts, r.sent_after_failure) == ("HEALTHY", 1, 0, 0), r


# ------------------------------------------------------------ adverbs


@pytest.mark.anyio
async def test_call_one_fanout_and_broadcast() -> None:
    async with running(Echo, replicas=3) as svc:
        assert len(svc) == 3
        assert await svc.double.call_one(21) == 42
        assert await svc.double.route(4) == 8
        assert await svc.double.call(5) == [10, 10, 10]
        assert await svc.double.fanout(6) == [12, 12, 12]
        assert svc.hit.broadcast("b") is None

        # broadcast has no reply: every replica records it soon after
        async def everyone_saw() -> bool:
            return all("b" in seen for seen in await svc.seen.call())

        deadline = time.monotonic() + 5.0
        while not await everyone_saw():
            assert time.monotonic() < deadline, "broadcast did not reach every replica"
            await asyncio.sleep(0.02)

        pids = await replica_pids(svc)
        assert len(set(pids)) == 3
        assert sorted(await svc.pid.call()) == sorted(pids)
        for i in range(3):
            assert isinstance(svc.replica(i), zmesh.ActorMesh)
            assert len(svc.replica(i)) == 1
        assert_clean(svc)
        stats = svc.statistics()
        assert isinstance(stats, zmesh.routing.ServiceStatistics)
        assert [r.index for r in stats.replicas] == [0, 1, 2]
        assert all(isinstance(r, zmesh.routing.ReplicaStatistics) for r in stats.replicas)


@pytest.mark.anyio
async def test_constructor_arguments_reach_every_replica() -> None:
    async with running(Echo, "tagged", replicas=2) as svc:
        assert await svc.whoami.call() == ["tagged", "tagged"]


@pytest.mark.anyio
async def test_call_one_on_a_two_proc_replica_reaches_both_ranks() -> None:
    async with running(Echo, replicas=2, procs=2) as svc:
        assert [svc.replica(i).sizes for i in range(2)] == [{"hosts": 1, "procs": 2}] * 2
        assert await svc.hit.call_one("one") == 0  # rank 0's value
        seen = [(await svc.replica(i).seen.call()).values() for i in range(2)]
        # exactly one replica got it, on both of its ranks
        assert sorted(seen) == [[[], []], [["one"], ["one"]]], seen

        assert await svc.hit.call("all") == [0, 0]
        for i in range(2):
            for ranks_seen in (await svc.replica(i).seen.call()).values():
                assert ranks_seen[-1] == "all"
        assert_clean(svc)

    async with running(Echo, replicas=1, procs=2, return_rank=1) as svc:
        assert await svc.hit.call_one("x") == 1


@pytest.mark.anyio
async def test_replicas_span_hosts(cluster: Any) -> None:
    async with running(Echo, replicas=2, hosts=2) as svc:
        assert [svc.replica(i).sizes for i in range(2)] == [{"hosts": 2, "procs": 1}] * 2
        assert await svc.hit.call_one("h") == 0
        assert await svc.hit.call("all") == [0, 0]
        for i in range(2):
            for ranks_seen in (await svc.replica(i).seen.call()).values():
                assert ranks_seen[-1] == "all"
        assert_clean(svc)


@pytest.mark.anyio
async def test_user_errors_raise_actor_error_and_keep_the_replica() -> None:
    async with running(Echo, replicas=2) as svc:
        pids = await replica_pids(svc)
        for _ in range(6):
            with pytest.raises(zmesh.ActorError) as info:
                await svc.fail.call_one("boom")
            assert info.value.remote_type == "ValueError"
            assert info.value.remote_message == "boom"
        with pytest.raises(zmesh.ActorError):
            await svc.fail.call("boom")
        stats = svc.statistics()
        assert stats.retried == 0  # a user error is an answer: never re-sent
        assert_clean(svc)
        assert await replica_pids(svc) == pids
        assert await svc.double.call_one(1) == 2


# ------------------------------------------------------------ routers


@pytest.mark.anyio
async def test_round_robin_spreads_evenly() -> None:
    async with running(Echo, replicas=3) as svc:
        pids = await replica_pids(svc)
        order = [await svc.pid.call_one() for _ in range(30)]
        assert set(order) == set(pids)
        assert spread(order) <= 1, Counter(order)
        # a full turn visits every replica once
        for k in range(0, 27, 3):
            assert len(set(order[k : k + 3])) == 3, order
        together = await asyncio.gather(*(svc.pid.call_one() for _ in range(31)))
        assert spread(together) <= 1, Counter(together)


@pytest.mark.anyio
@pytest.mark.parametrize("router", ["least_loaded", "instance"])
async def test_least_loaded_avoids_a_busy_replica(router: str) -> None:
    chosen = zmesh.routing.LeastLoadedRouter() if router == "instance" else router
    async with running(Echo, replicas=3, router=chosen) as svc:
        async with svc.session() as s:
            busy = [svc.nap.call_one(1.5) for _ in range(6)]  # six calls on one replica
            await asyncio.sleep(0)  # (they are under way already)
            assert s.replica is not None
            busy_pid = await svc.replica(s.replica).pid.call_one()
        quick = [await svc.nap.call_one(0) for _ in range(10)]
        assert busy_pid not in quick
        assert spread(quick) <= 1
        assert set(await asyncio.gather(*busy)) == {busy_pid}
        together = await asyncio.gather(*(svc.nap.call_one(0.3) for _ in range(30)))
        assert spread(together) <= 1, Counter(together)


class HighestRouter(zmesh.routing.Router):
    """Always the healthy replica with the highest index; records what it was shown."""

    def __init__(self) -> None:
        self.shown: list[tuple[list[int], str | None]] = []

    def choose(
        self, replicas: Sequence[zmesh.routing.ReplicaStatistics], session: str | None
    ) -> int:
        self.shown.append(([r.index for r in replicas], session))
        return max(r.index for r in replicas)


@pytest.mark.anyio
async def test_a_router_of_your_own() -> None:
    router = HighestRouter()
    async with running(Echo, replicas=3, router=router) as svc:
        last = await svc.replica(2).pid.call_one()
        assert [await svc.pid.call_one() for _ in range(10)] == [last] * 10
        assert len(router.shown) >= 10
        assert all(indexes == [0, 1, 2] for indexes, _ in router.shown)
        assert {session for _, session in router.shown} == {None}
        async with svc.session("abc") as s:
            assert await svc.pid.call_one() == last
            assert s.replica == 2
        assert ([0, 1, 2], "abc") in router.shown
        # fan-out does not route
        assert len(await svc.pid.call()) == 3


# ------------------------------------------------------------ sessions


@pytest.mark.anyio
async def test_session_keeps_calls_on_one_replica() -> None:
    async with running(Echo, replicas=3) as svc:
        async with svc.session() as s:
            assert isinstance(s.id, str) and s.id
            got = [await svc.pid.call_one() for _ in range(20)]
            assert len(set(got)) == 1, got
            assert s.replica is not None
            assert await svc.replica(s.replica).pid.call_one() == got[0]
            assert s.rebinds == 0
            # concurrent calls in a session too
            assert set(await asyncio.gather(*(svc.pid.call_one() for _ in range(10)))) == {got[0]}
        # outside the session, round robin again
        outside = [await svc.pid.call_one() for _ in range(6)]
        assert len(set(outside)) == 3

        one_off = {await svc.pid.options(session="by-option").call_one() for _ in range(10)}
        assert len(one_off) == 1
        assert svc.session("by-option").replica is not None  # the same session, by id

        async with svc.session("my-id") as named:
            assert named.id == "my-id"
            pids = {await svc.pid.call_one() for _ in range(10)}
            assert len(pids) == 1
            assert named.rebinds == 0
        assert_clean(svc)


def test_bad_settings_fail_at_options() -> None:
    with pytest.raises(TypeError):
        Echo.options(replicas=2, no_such_setting=1)
    with pytest.raises(ValueError):
        Echo.options(replicas=2, max_queue=-1)
    with pytest.raises(ValueError):
        Echo.options(replicas=2, router="random")
    with pytest.raises(ValueError):
        Echo.options(replicas=0)
    with pytest.raises(ValueError):
        Echo.options(replicas=2).as_actor()


def test_service_from_plain_code() -> None:
    svc = Echo.options(replicas=2).as_service().get(timeout=60)
    try:
        assert svc.double.call_one(3).get(timeout=10) == 6
        assert svc.double.call(3).get(timeout=10) == [6, 6]
        with svc.session() as s:
            got = {svc.pid.call_one().get(timeout=10) for _ in range(10)}
            assert len(got) == 1
            assert s.replica is not None
        with svc.session("sync-id") as s:
            assert s.id == "sync-id"
            assert len({svc.pid.call_one().get(timeout=10) for _ in range(5)}) == 1
        assert svc.statistics().state == "OK"
    finally:
        svc.stop().get(timeout=30)


# ------------------------------------------------------------ request ids


@pytest.mark.anyio
async def test_each_request_has_an_id() -> None:
    async with running(Echo, replicas=2) as svc:
        ids = [await svc.request_id.call_one() for _ in range(10)]
        assert all(isinstance(i, str) and i for i in ids)
        assert len(set(ids)) == 10
        async with svc.session():
            in_session = {await svc.request_id.call_one() for _ in range(5)}
        assert len(in_session) == 5 and not in_session & set(ids)
    assert zmesh.current_request() == ""  # not inside a service call
    plain = await Echo.options().as_actor()
    try:
        assert await plain.request_id.call_one() == ""  # an actor call is not a service call
    finally:
        await plain.stop()


# ------------------------------------------------------------ bounded work


@pytest.mark.anyio
async def test_a_call_takes_a_timeout() -> None:
    async with running(Echo, replicas=2, request_timeout=0.3) as svc:
        t0 = time.monotonic()
        with pytest.raises(zmesh.CallTimeoutError):
            await svc.nap.call_one(5)
        assert time.monotonic() - t0 < 1.5
        t0 = time.monotonic()
        with pytest.raises(zmesh.CallTimeoutError):
            await svc.nap.options(timeout=0.2).call_one(5)
        assert time.monotonic() - t0 < 1.5
        assert await svc.nap.options(timeout=5).call_one(0.5) in await replica_pids(svc)
        # a slow answer is not a failed replica
        assert_clean(svc)


@pytest.mark.anyio
async def test_overload_fails_fast() -> None:
    async with running(Echo, replicas=2, max_concurrent_requests=1, max_queue=1) as svc:
        pids = await replica_pids(svc)
        held = [svc.nap.call_one(1.5) for _ in range(4)]  # 1 running + 1 queued, per replica

        def loaded() -> bool:
            rs = svc.statistics().replicas
            return [(r.in_flight, r.queued) for r in rs] == [(1, 1), (1, 1)]

        await wait_until(loaded, 2.0, "each replica at max_concurrent_requests with a full queue")
        for _ in range(3):
            t0 = time.monotonic()
            with pytest.raises(zmesh.ServiceOverloadedError) as info:
                await svc.nap.call_one(0)
            took = time.monotonic() - t0
            print(f"\nLATENCY overload -> ServiceOverloadedError: {took * 1000:.1f} ms")
            assert took < 0.25
            assert isinstance(info.value, zmesh.ServiceError)
        assert sorted(await asyncio.gather(*held)) == sorted(pids * 2)
        assert await svc.nap.call_one(0) in pids  # room again
        stats = svc.statistics()
        assert stats.completed >= 5 and stats.retried == 0
        assert_clean(svc)


# ------------------------------------------------------------ health checks


@pytest.mark.anyio
@pytest.mark.slow
@pytest.mark.parametrize("trouble", ["make_sick", "make_hung"])
async def test_failing_health_check_replaces_the_replica(trouble: str) -> None:
    # A failing (or silent, idle) check makes it UNREADY; after unready_timeout it is replaced.
    async with running(
        Echo, replicas=2, health_interval=0.2, health_timeout=0.5, backoff_initial=0.1,
        unready_timeout=1.0,
    ) as svc:  # fmt: skip
        old = await replica_pids(svc)
        await getattr(svc.replica(0), trouble).call_one()
        t0 = time.monotonic()

        def replaced() -> bool:
            r0 = svc.statistics().replicas[0]
            return r0.generation == 2 and r0.state == "HEALTHY"

        took = await wait_until(replaced, 15.0, "replica 0 replaced after its health check")
        print(f"\nLATENCY {trouble} -> replica replaced and healthy: {took:.2f} s")
        stats = svc.statistics()
        r0, r1 = stats.replicas
        assert r0.restarts == 1 and r0.last_failure, r0
        assert (r1.generation, r1.restarts, r1.state) == (1, 0, "HEALTHY")
        assert r0.sent_after_failure == 0 and r1.sent_after_failure == 0
        new = await replica_pids(svc)
        assert new[0] != old[0] and new[1] == old[1]
        wait_gone([old[0]], 10.0, "the replaced replica's proc")
        assert time.monotonic() - t0 < 15.0
        results = await asyncio.gather(*(svc.double.call_one(i) for i in range(20)))
        assert results == [2 * i for i in range(20)]
        assert stats.state == "OK"


# ------------------------------------------------------------ statistics and stop


@pytest.mark.anyio
async def test_statistics_and_stop() -> None:
    async with running(Echo, replicas=2) as svc:
        for i in range(20):
            assert await svc.double.call_one(i) == 2 * i
        stats = svc.statistics()
        assert stats.state == "OK"
        assert stats.completed == 20 == sum(r.completed for r in stats.replicas)
        assert stats.failed == 0 and stats.retried == 0
        for r in stats.replicas:
            assert r.completed == 10 and r.sent == 10  # round robin, first generation
            assert r.in_flight == 0 and r.queued == 0 and r.failed == 0
            assert r.p50 is not None and r.p99 is not None
            assert 0 < r.p50 <= r.p99 < 5.0
            assert r.last_failure == ""
        pids = await replica_pids(svc)
        assert all(pid_alive(p) for p in pids)
    stats = svc.statistics()
    assert states(svc) == ["STOPPED", "STOPPED"]
    assert stats.state != "OK"
    wait_gone(pids, 10.0, "replica procs after stop()")
    with pytest.raises(zmesh.ActorStoppedError):  # "you stopped it", not "it broke"
        await svc.double.options(timeout=2).call_one(1)


def test_statistics_from_another_thread_under_load() -> None:
    """statistics() from plain code while the service's loop completes requests."""
    svc = Echo.options(replicas=2).as_service().get(timeout=60)
    try:
        pending = [svc.nap.call_one(0.001) for _ in range(2000)]
        reads = 0
        while not all(f.done() for f in pending):
            stats = svc.statistics()
            assert stats.state == "OK"
            reads += 1
        assert all(f.get(timeout=10) for f in pending)
        assert svc.statistics().completed == 2000
        print(f"\n{reads} statistics() reads while 2000 requests completed")
    finally:
        svc.stop().get(timeout=30)


@pytest.mark.anyio
async def test_a_request_whose_caller_timed_out_holds_its_slot_until_answered() -> None:
    """max_concurrent_requests counts what the replica runs, not what callers await."""
    async with running(Echo, replicas=1, max_concurrent_requests=1, max_queue=5) as svc:
        with pytest.raises(zmesh.CallTimeoutError):
            await svc.nap.options(timeout=0.3).call_one(3.0)  # runs on well past it
        rep = svc.statistics().replicas[0]
        assert rep.in_flight == 1  # the proc is still running it
        second = asyncio.ensure_future(svc.nap.call_one(0.0))
        await wait_until(lambda: svc.statistics().replicas[0].queued == 1, 2.0, "it to queue")
        assert not second.done()
        await asyncio.wait_for(second, 10.0)  # sent once the first answered
        await wait_until(lambda: svc.statistics().replicas[0].in_flight == 0, 5.0, "no slot held")

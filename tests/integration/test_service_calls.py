"""Services feel like the class you wrote (issue 15): direct calls, one
``spawn()``, ``choose``/``stream``, sessions that keep their promise, and a
service that outlives the event loop that made it. Real procs throughout.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest

import zmesh

from _actors import Napper


class Echo(Napper):
    @zmesh.endpoint
    async def double(self, x: int) -> int:
        return 2 * x


@zmesh.service(replicas=2, max_queue=7)
class Decorated(Echo):
    pass


async def wait_until(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.02)


@pytest.mark.anyio
async def test_direct_calls_on_a_service_and_on_one_actor() -> None:
    svc = await Echo.options(replicas=2).spawn()
    try:
        assert isinstance(svc, zmesh.Service)
        assert await svc.double(21) == 42
        assert await svc.double(x=2) == 4
        # Sync code (here from a worker thread) gets the same with .get().
        assert await asyncio.to_thread(lambda: svc.double(5).get(timeout=10)) == 10
    finally:
        await svc.stop()
    one = await Echo.options().spawn()
    many = await Echo.options(procs=2).spawn()
    try:
        assert isinstance(one, zmesh.ActorMesh)
        assert await one.double(3) == 6
        with pytest.raises(ValueError, match=r"call\(.*choose\(.*call_one\("):
            many.double(1)
    finally:
        await one.stop()
        await many.stop()


@pytest.mark.anyio
async def test_one_spawn_the_service_decorator_and_a_whole_config() -> None:
    svc = await Decorated.options().spawn()
    try:
        assert isinstance(svc, zmesh.Service)
        assert len(svc) == 2 and svc.config.max_queue == 7
        assert await svc.double(1) == 2
    finally:
        await svc.stop()
    over = Decorated.options(replicas=3, max_queue=9)
    assert (over.replicas, over.service_config["max_queue"]) == (3, 9)
    whole = Echo.options(replicas=2, config=zmesh.ServiceConfig(max_queue=5, request_timeout=9))
    assert whole.service_config["max_queue"] == 5 and whole.is_service
    assert Echo.options(config=zmesh.ServiceConfig(), max_queue=3).service_config["max_queue"] == 3
    assert not Echo.options(procs=2).is_service
    with pytest.raises(ValueError):
        zmesh.service(replicas=2, max_queue=-1)(type("Bad", (Echo,), {}))
    with pytest.raises(TypeError):
        zmesh.service(replicas=2)(object)  # type: ignore[type-var]


@pytest.mark.anyio
async def test_choose_avoids_a_busy_replica_and_stream_gives_every_replica() -> None:
    svc = await Echo.options(replicas=2, router="round_robin").spawn()
    try:
        with svc.session() as s:
            busy = [svc.nap(2.0) for _ in range(4)]
            await wait_until(lambda: s.replica is not None, 5, "the session is bound")
            assert s.replica is not None
            replica = svc.replica(s.replica)
            assert replica is not None
            busy_pid = await replica.pid.call_one()
        chosen = [await svc.nap.choose(0) for _ in range(6)]
        assert busy_pid not in chosen  # round robin alone would have sent half there
        assert set(await asyncio.gather(*busy)) == {busy_pid}
        pids = [p async for p in svc.pid.stream()]
        assert sorted(pids) == sorted(await svc.pid.call())
        assert len(set(pids)) == 2
        assert sorted(await asyncio.to_thread(lambda: list(svc.pid.stream()))) == sorted(pids)
    finally:
        await svc.stop()


@pytest.mark.anyio
async def test_a_session_is_bound_to_a_generation() -> None:
    """Killed and respawned before the next call: the session notices."""
    svc = await Echo.options(replicas=2, backoff_initial=0.05).spawn()
    try:
        loose, strict = svc.session(), svc.session(strict=True)
        with loose:
            victim = await svc.pid()
        with strict:
            assert await svc.pid() is not None
        index = loose.replica
        assert index is not None
        strict.replica, strict.generation = index, loose.generation  # both on the victim
        os.kill(victim, signal.SIGKILL)
        await wait_until(
            lambda: (
                svc.statistics().replicas[index].generation == 2
                and svc.statistics().replicas[index].state == "HEALTHY"
            ),
            30,
            "the killed replica is back in generation 2",
        )
        with loose:
            assert await svc.pid() != victim
        assert (loose.rebinds, loose.rebound) == (1, True)
        with strict, pytest.raises(zmesh.SessionLostError, match="state it kept there is gone"):
            await svc.pid()
        with strict:
            assert await svc.double(2) == 4  # bound afresh
        assert (strict.rebinds, strict.rebound) == (1, True)
    finally:
        await svc.stop()


def test_a_service_outlives_the_loop_that_made_it() -> None:
    async def make() -> Any:
        svc = await Echo.options(replicas=2).spawn()
        assert await svc.double(1) == 2
        return svc

    svc = asyncio.run(make())  # that loop is gone now

    async def use() -> list[int]:
        return [await svc.double(i) for i in range(5)]

    try:
        assert asyncio.run(use()) == [0, 2, 4, 6, 8]
        assert svc.double(4).get(timeout=10) == 8
        assert svc.statistics().state == "OK"
    finally:
        svc.stop().get(timeout=30)


@pytest.mark.stress
@pytest.mark.anyio
async def test_a_fanout_stream_of_a_service_stopped_under_it_says_it_was_stopped() -> None:
    # As the fan-out call does: "you stopped it" (ActorStoppedError), never
    # "every replica failed" (ServiceError), read with async for or plain for.
    svc = await Napper.options(replicas=3).as_service()
    try:
        nap = svc.nap.options(timeout=30)
        streams = [nap.stream(30.0) for _ in range(20)]
        plain = [nap.stream(30.0) for _ in range(5)]

        async def read(stream: Any) -> list[int]:
            return [v async for v in stream]

        reads = [asyncio.ensure_future(read(s)) for s in streams]
        reads += [asyncio.ensure_future(asyncio.to_thread(list, s)) for s in plain]
        deadline = time.monotonic() + 20
        while sum(r.in_flight for r in svc.statistics().replicas) < 3 * 25:
            assert time.monotonic() < deadline, "the fan-outs never got under way"
            await asyncio.sleep(0.02)
        await svc.stop()
        outcomes = await asyncio.wait_for(asyncio.gather(*reads, return_exceptions=True), 10)
        wrong = [o for o in outcomes if not isinstance(o, zmesh.ActorStoppedError)]
        assert not wrong, f"{len(wrong)} fan-out streams ended otherwise: {wrong[:3]}"
        with pytest.raises(zmesh.ActorStoppedError):
            await read(nap.stream(0.0))  # and one made after the stop
    finally:
        await svc.stop()

"""The sync path without hops: ``call_one(...).get()`` from plain threads.

A thread with no event loop sends on its own lane (zmesh._client.lanes) and
polls for the reply itself. These check that it is used, and that it keeps
every guarantee of the I/O path: order per caller (also mixed with other
adverbs), typed errors, timeouts, a killed proc failing the call at once,
many threads at once, and no call lost.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import zmesh

from _actors import Journal, Pid
from _helpers import (
    keep_module_meshes,  # noqa: F401  (a fixture: the mesh outlives tests)
    module_mesh,
)


class Log(Journal, Pid):
    @zmesh.endpoint
    async def boom(self, message: str) -> None:
        raise KeyError(message)

    @zmesh.endpoint
    async def sleep(self, seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds


@pytest.fixture(scope="module")
def log_actor() -> Iterator[zmesh.ActorMesh[Log]]:
    yield from module_mesh(Log)


def _fresh() -> zmesh.ActorMesh[Log]:
    return Log.options().as_actor().get(timeout=60)


def test_sync_calls_take_the_lane_and_keep_their_order(log_actor: zmesh.ActorMesh[Log]) -> None:
    log_actor.take.call_one().get(timeout=10)  # the first call connects (the I/O path)
    futs = [log_actor.append.call_one(i) for i in range(2000)]
    assert all(f._sync is not None for f in futs), "sync calls did not take the lane"
    assert [f.get(timeout=30) for f in futs] == list(range(2000))
    assert log_actor.take.call_one().get(timeout=10) == list(range(2000))


def test_lane_calls_and_other_adverbs_keep_their_relative_order(
    log_actor: zmesh.ActorMesh[Log],
) -> None:
    log_actor.take.call_one().get(timeout=10)
    futs: list[zmesh.Future[Any]] = []
    for i in range(600):
        if i % 3 == 0:
            log_actor.append.broadcast(i)
        elif i % 3 == 1:
            futs.append(log_actor.append.call_one(i))
        else:
            futs.append(log_actor.append.call(i))
    for f in futs:
        f.get(timeout=30)
    assert log_actor.take.call_one().get(timeout=10) == list(range(600))


def test_lane_errors_are_typed(log_actor: zmesh.ActorMesh[Log]) -> None:
    log_actor.take.call_one().get(timeout=10)
    fut: zmesh.Future[Any] = log_actor.boom.call_one("nope")
    assert fut._sync is not None
    with pytest.raises(zmesh.ActorError) as info:
        fut.get(timeout=10)
    assert info.value.remote_type == "KeyError"
    # A per-call timeout fails the call with CallTimeoutError, on time.
    t = time.monotonic()
    with pytest.raises(zmesh.CallTimeoutError, match="no reply within"):
        log_actor.sleep.options(timeout=0.3).call_one(5.0).get(timeout=10)
    assert time.monotonic() - t < 3.0
    # A .get() timeout leaves the call going: a later .get() has its value.
    fut = log_actor.sleep.call_one(0.5)
    with pytest.raises(zmesh.CallTimeoutError, match="the call goes on"):
        fut.get(timeout=0.05)
    assert fut.get(timeout=10) == 0.5
    # done() reads what arrived without a .get().
    fut = log_actor.append.call_one(7)
    deadline = time.monotonic() + 10
    while not fut.done():
        assert time.monotonic() < deadline, "done() never saw the reply"
        time.sleep(0.001)
    assert fut.get(timeout=0) == 7


def test_a_lane_future_can_be_awaited_and_got_from_another_thread(
    log_actor: zmesh.ActorMesh[Log],
) -> None:
    log_actor.take.call_one().get(timeout=10)
    fut = log_actor.sleep.call_one(0.2)
    assert fut._sync is not None
    got: list[float] = []
    t = threading.Thread(target=lambda: got.append(fut.get(timeout=10)))
    t.start()
    t.join(15)
    assert got == [0.2]

    other = log_actor.append.call_one(3)

    async def main() -> int:
        return await other

    assert asyncio.run(main()) == 3


def test_kill_9_of_the_proc_fails_the_lane_call_quickly() -> None:
    m = _fresh()
    pid = m.pid.call_one().get(timeout=10)
    fut = m.sleep.call_one(60.0)
    assert fut._sync is not None
    time.sleep(0.2)  # the call is running in the proc
    t = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(zmesh.SupervisionError, match="SIGKILL"):
        fut.get(timeout=20)
    assert time.monotonic() - t < 3.0, "the killed proc's call did not fail fast"
    # Later calls fail at once, before anything is sent.
    with pytest.raises(zmesh.SupervisionError):
        m.append.call_one(1).get(timeout=5)


def test_many_threads_at_once(log_actor: zmesh.ActorMesh[Log]) -> None:
    log_actor.take.call_one().get(timeout=10)
    errors: list[BaseException] = []
    n, per = 8, 300

    def run(base: int) -> None:
        try:
            for i in range(per):
                assert log_actor.append.call_one(base + i).get(timeout=30) == base + i
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k * 10_000,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    log = log_actor.take.call_one().get(timeout=10)
    for k in range(n):  # each thread's calls in its order
        assert [x for x in log if k * 10_000 <= x < (k + 1) * 10_000] == [
            k * 10_000 + i for i in range(per)
        ]


@pytest.mark.stress
def test_ten_thousand_sync_calls_none_lost(log_actor: zmesh.ActorMesh[Log]) -> None:
    log_actor.take.call_one().get(timeout=10)
    for i in range(10_000):
        assert log_actor.append.call_one(i).get(timeout=30) == i
    assert log_actor.take.call_one().get(timeout=10) == list(range(10_000))

"""The sync path without hops: ``call_one(...).get()`` from plain threads.

A thread with no event loop sends on its own lane (zmesh._client.calls.lanes) and
polls for the reply itself. These check that it is used (also for one actor
of several in a proc), and that it keeps every guarantee of the I/O path:
order per caller (also mixed with other adverbs), typed errors, timeouts,
replies of every shape, a killed proc failing the call at once, many threads
at once, a fork, and no call lost.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import zmesh
from zmesh._client.calls.synccall import SyncCall

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
    async def shape(self, k: int) -> Any:
        return SHAPES[k]

    @zmesh.endpoint
    async def sleep(self, seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds


# Replies of every shape the lane reads (made in the actor: arguments with
# buffers would take the I/O path).
SHAPES: list[Any] = [
    b"x" * 200_000,  # a buffer frame after the envelope
    [1, pickle.PickleBuffer(b"y" * 300_000)],  # pickled, with an out-of-band buffer
    {"a": 1, "b": (2, 3)},  # pickled, in the envelope
    "text",
    None,
]


@pytest.fixture(scope="module")
def log_actor() -> Iterator[zmesh.ActorMesh[Log]]:
    yield from module_mesh(Log)


def _fresh() -> zmesh.ActorMesh[Log]:
    return Log.options().as_actor().get(timeout=60)


def _on_the_lane(m: zmesh.ActorMesh[Log]) -> int:
    """Call ``m`` until a call takes the lane; its proc's pid.

    The first calls may not: a mesh just spawned lets calls through its gate
    once the loop has drained what queued there, a moment after ``.get()``
    returned (later under load), and the lane waits for an answered I/O call.
    """
    deadline = time.monotonic() + 10
    while True:
        fut = m.pid.call_one()
        pid = fut.get(timeout=10)
        if isinstance(fut, SyncCall):
            return pid
        assert time.monotonic() < deadline, "calls never took the lane"


def test_sync_calls_take_the_lane_and_keep_their_order(log_actor: zmesh.ActorMesh[Log]) -> None:
    log_actor.take.call_one().get(timeout=10)  # the first call connects (the I/O path)
    futs = [log_actor.append.call_one(i) for i in range(2000)]
    assert all(isinstance(f, SyncCall) for f in futs), "sync calls did not take the lane"
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
    assert isinstance(fut, SyncCall)
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
    t = time.monotonic()
    with pytest.raises(zmesh.CallTimeoutError, match="the call goes on"):
        fut.get(timeout=0.05)
    # Kept whole, not more: the first receive's slice counts against it.
    assert 0.05 <= time.monotonic() - t < 0.4
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
    assert isinstance(fut, SyncCall)
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
    pid = _on_the_lane(m)
    fut = m.sleep.call_one(60.0)
    assert isinstance(fut, SyncCall)
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


def test_replies_of_every_shape_come_back_on_the_lane(log_actor: zmesh.ActorMesh[Log]) -> None:
    log_actor.take.call_one().get(timeout=10)
    futs = [log_actor.shape.call_one(k) for k in range(len(SHAPES))] * 2
    assert all(isinstance(f, SyncCall) for f in futs)
    got = [f.get(timeout=30) for f in futs]
    for k in (1, 6):  # the out-of-band buffer arrives as a buffer of the frame
        pickled, buffer = got[k]
        assert pickled == 1 and bytes(memoryview(buffer)) == b"y" * 300_000
    assert [v for k, v in enumerate(got) if k not in (1, 6)] == [
        SHAPES[k] for k in (0, 2, 3, 4)
    ] * 2


def test_one_actor_of_several_in_a_proc_is_called_on_the_lane() -> None:
    procs, per = 2, 3
    m = Log.options(procs=procs, actors_per_proc=per).as_actor().get(timeout=60)
    try:
        actors = [m.slice(procs=p, actors=a) for p in range(procs) for a in range(per)]
        for one in actors:  # the first call to a proc connects (the I/O path)
            one.take.call_one().get(timeout=10)
        futs: list[list[zmesh.Future[Any]]] = [[] for _ in actors]
        for i in range(300):  # interleaved across the actors of both procs
            for k, one in enumerate(actors):
                futs[k].append(one.append.call_one(k * 1000 + i))
        assert all(isinstance(f, SyncCall) for fs in futs for f in fs), "not on the lane"
        for k, fs in enumerate(futs):
            assert [f.get(timeout=30) for f in fs] == [k * 1000 + i for i in range(300)]
        for k, one in enumerate(actors):  # each actor got its own calls, in order
            assert one.take.call_one().get(timeout=10) == [k * 1000 + i for i in range(300)]
        # Errors name the actor's rank, not its proc's.
        with pytest.raises(zmesh.ActorError) as info:
            m.slice(procs=1, actors=2).boom.call_one("nope").get(timeout=10)
        assert info.value.rank == 1 * per + 2 and info.value.remote_type == "KeyError"
        # A killed proc fails its actors' lane calls, each with its rank.
        pid = m.slice(procs=1, actors=0).pid.call_one().get(timeout=10)
        slow = [m.slice(procs=1, actors=a).sleep.call_one(60.0) for a in range(per)]
        assert all(isinstance(f, SyncCall) for f in slow)
        time.sleep(0.2)  # the calls are running in the proc
        t = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        for a, f in enumerate(slow):
            with pytest.raises(zmesh.SupervisionError) as sup:
                f.get(timeout=20)
            assert sup.value.rank == 1 * per + a
        assert time.monotonic() - t < 3.0, "the killed proc's calls did not fail fast"
        assert m.slice(procs=0, actors=1).append.call_one(5).get(timeout=10) == 5
    finally:
        m.stop().get(timeout=30)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_call_in_flight_when_the_process_forks_fails_in_the_child(
    log_actor: zmesh.ActorMesh[Log],
) -> None:
    log_actor.take.call_one().get(timeout=10)
    fut = log_actor.sleep.call_one(0.5)
    assert isinstance(fut, SyncCall)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its reply goes to the parent, so it fails here at once
        code = 1
        try:
            t = time.monotonic()
            try:
                fut.get(timeout=5)
            except zmesh.ConnectionLostError:
                code = 0 if time.monotonic() - t < 1.0 else 2
            except BaseException:
                code = 3
            os.write(w, bytes([code]))
        finally:
            os._exit(0)
    os.close(w)
    try:
        got = os.read(r, 1)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert got == b"\x00", f"the child's .get() did not fail at once: {got!r}"
    assert fut.get(timeout=10) == 0.5  # the parent has its reply

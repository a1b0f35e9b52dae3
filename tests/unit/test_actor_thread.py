"""An actor's own worker thread (zmesh._host.proc.actorthread): one thread per actor,
never queued behind, at most ``ZMESH_ACTOR_THREADS`` of them per process."""

from __future__ import annotations

import asyncio
import threading

import pytest

from zmesh._host.proc.actorthread import ActorThread
from zmesh._host.proc.cancelling import Running


def _name() -> str:
    return threading.current_thread().name


@pytest.mark.anyio
async def test_calls_run_in_one_thread_and_settle_on_the_loop() -> None:
    loop = asyncio.get_running_loop()
    at = ActorThread(loop, "counter")
    try:
        names = [await at.run(_name) for _ in range(5)]
        assert names == ["zmesh-actor-counter"] * 5
        with pytest.raises(KeyError):  # an error comes back as the future's
            await at.run({}.__getitem__, "missing")
        settled: list[bool] = []
        fut = at.run(_name)
        fut.add_done_callback(
            lambda _: settled.append(threading.current_thread() is threading.main_thread())
        )
        await fut
        assert settled == [True]  # resolved in the loop's thread
    finally:
        at.close()


@pytest.mark.anyio
async def test_a_busy_thread_is_not_free_and_at_most_the_limit_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ZMESH_ACTOR_THREADS", str(ActorThread.live + 2))
    loop = asyncio.get_running_loop()
    a, b, c = (ActorThread(loop, n) for n in "abc")
    gate = threading.Event()
    try:
        assert a.free() and b.free() and c.free()  # none started yet
        blocked = a.run(gate.wait, 10)
        assert not a.free()  # busy: a call now would wait behind it
        await b.run(_name)
        assert b.free()  # started and idle
        assert not c.free()  # two run already: the third actor uses the pool
        gate.set()
        assert await blocked is True
        assert a.free()
        b.close()
        assert c.free()  # one ended: room for another
        assert await c.run(_name) == "zmesh-actor-c"
    finally:
        gate.set()
        for t in (a, b, c):
            t.close()


@pytest.mark.anyio
async def test_close_ends_the_thread_after_its_call() -> None:
    loop = asyncio.get_running_loop()
    at = ActorThread(loop, "closing")
    before = ActorThread.live
    await at.run(_name)
    thread = at.thread
    assert thread is not None and ActorThread.live == before + 1
    at.close()
    assert ActorThread.live == before
    await asyncio.to_thread(thread.join, 10)
    assert not thread.is_alive()


def test_a_call_is_claimed_once_whichever_thread_comes_first() -> None:
    # The actor's thread and the loop each claim a sync call before they
    # answer it (zmesh._host.proc.actorthread): exactly one wins, even racing.
    for _ in range(200):
        run = Running(None, False)
        wins: list[bool] = []
        barrier = threading.Barrier(2)

        def claim(
            run: Running = run, wins: list[bool] = wins, barrier: threading.Barrier = barrier
        ) -> None:
            barrier.wait()
            wins.append(run.claim())

        threads = [threading.Thread(target=claim) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(wins) == [False, True]

"""A ``def`` endpoint's answers from its actor's thread, under load and stops.

The actor's thread sends a plain result itself and tells the proc's loop
without waking it (``zmesh._host.proc.actorthread``); the loop settles the call
at its next turn. Two ways that could break a promise:

* a call queued behind the running one would wait for a timer (the next
  heartbeat) if nothing woke the loop: thousands of pipelined calls must
  come back in about the time they take, not 0.2 s each;
* an actor stopped while its thread answers: the thread and the loop each
  claim the call before answering, so only one of them does (the unit
  test of ``Running.claim``), and every call resolves, with its value or
  ``ActorStoppedError``, never hanging.

Without the wake-up for a queued call, the first test took 107 s here.
"""

from __future__ import annotations

import asyncio
import time

import pytest

import zmesh

pytestmark = pytest.mark.stress

CALLS = 3_000


class Worker(zmesh.Actor):
    @zmesh.endpoint
    def echo(self, x: int) -> int:
        return x

    @zmesh.endpoint
    def nap(self, x: int) -> int:
        time.sleep(0.002)
        return x


def test_pipelined_def_calls_all_come_back_without_waiting_for_a_timer() -> None:
    one = Worker.options().as_actor().get(timeout=60)
    try:

        async def main() -> list[int]:
            return list(await asyncio.gather(*(one.echo.call_one(i) for i in range(CALLS))))

        t0 = time.monotonic()
        assert asyncio.run(main()) == list(range(CALLS))
        # 3,000 calls waiting 0.2 s each for a heartbeat would take 600 s.
        assert time.monotonic() - t0 < 60
    finally:
        one.stop().get(timeout=20)


def test_stopping_an_actor_mid_burst_resolves_every_call_once() -> None:
    for _ in range(3):
        one = Worker.options().as_actor().get(timeout=60)
        futures = [one.nap.call_one(i) for i in range(300)]
        futures[20].get(timeout=30)  # its thread is answering calls now
        one.stop().get(timeout=20)
        stopped = 0
        for i, fut in enumerate(futures):
            try:
                assert fut.get(timeout=20) == i
            except zmesh.ActorStoppedError:
                stopped += 1
        assert stopped > 0  # (the stop came in the middle)

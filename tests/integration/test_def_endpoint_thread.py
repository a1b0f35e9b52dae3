"""An actor's ``def`` endpoints run in a thread of its own (zmesh._host.proc.actorthread).

Cheaper than the proc's pool (one queue put there, one loop wake-up back),
and thread-bound state stays with the actor from call to call. These check
that, and that it keeps the promises of the pool: a blocked actor holds up
nobody else, a call beside a busy thread does not wait behind it, a stop
answers the call running in it, and a ``BaseException`` raised in it comes
back to its caller typed. Its answer leaves from the thread itself, so it
does not wait for the proc's loop.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import zmesh

from _helpers import wait_for


class Threaded(zmesh.Actor):
    def __init__(self) -> None:
        self.local = threading.local()

    @zmesh.endpoint
    def where(self) -> tuple[int, str]:
        return threading.get_ident(), threading.current_thread().name

    @zmesh.endpoint
    def count(self) -> int:
        """Thread-bound state: a counter in a ``threading.local``."""
        self.local.n = getattr(self.local, "n", 0) + 1
        return int(self.local.n)

    @zmesh.endpoint
    def block(self, seconds: float, flag: str) -> float:
        Path(flag).touch()
        time.sleep(seconds)
        return seconds

    @zmesh.endpoint(concurrent=True)
    def beside(self) -> str:
        return threading.current_thread().name

    @zmesh.endpoint
    def exit(self) -> None:
        raise KeyboardInterrupt("from a def endpoint")


class LoopHog(zmesh.Actor):
    @zmesh.endpoint
    async def hog(self, seconds: float, flag: str) -> float:
        Path(flag).touch()
        time.sleep(seconds)  # (holds the proc's loop, on purpose)
        return seconds


def test_each_actors_def_endpoints_run_in_one_thread_of_its_own() -> None:
    procs = zmesh.this_host().spawn_procs(per_host={"procs": 1}).get(timeout=60)
    try:
        a = procs.spawn("a", Threaded).get(timeout=30)
        b = procs.spawn("b", Threaded).get(timeout=30)
        seen_a = {a.where.call_one().get(timeout=10) for _ in range(20)}
        seen_b = {b.where.call_one().get(timeout=10) for _ in range(20)}
        assert len(seen_a) == 1 and len(seen_b) == 1, (seen_a, seen_b)
        assert seen_a != seen_b  # two actors of one proc: two threads
        assert next(iter(seen_a))[1].startswith("zmesh-actor-a")
        # So state bound to a thread stays with the actor from call to call.
        assert [a.count.call_one().get(timeout=10) for _ in range(5)] == [1, 2, 3, 4, 5]
    finally:
        procs.stop().get(timeout=20)


def test_a_call_beside_a_busy_actor_thread_does_not_wait_behind_it(tmp_path: Path) -> None:
    one = Threaded.options().as_actor().get(timeout=60)
    try:
        flag = tmp_path / "blocking"
        blocked = one.block.call_one(3.0, str(flag))
        wait_for(flag.exists, 10, "the def endpoint to start blocking")
        t0 = time.monotonic()
        name = one.beside.call_one().get(timeout=10)  # concurrent: the pool runs it
        assert time.monotonic() - t0 < 1.5, "it waited for the blocked actor thread"
        assert not name.startswith("zmesh-actor-"), name
        assert not blocked.done()
        assert blocked.get(timeout=10) == 3.0
        # The thread is the actor's again once it is free.
        assert one.where.call_one().get(timeout=10)[1].startswith("zmesh-actor-")
    finally:
        one.stop().get(timeout=20)


def test_stopping_an_actor_in_its_thread_answers_the_call_and_the_proc_goes_on(
    tmp_path: Path,
) -> None:
    procs = zmesh.this_host().spawn_procs(per_host={"procs": 1}).get(timeout=60)
    try:
        a = procs.spawn("a", Threaded).get(timeout=30)
        b = procs.spawn("b", Threaded).get(timeout=30)
        flag = tmp_path / "blocking"
        blocked = a.block.call_one(5.0, str(flag))
        wait_for(flag.exists, 10, "the def endpoint to start blocking")
        t0 = time.monotonic()
        a.stop().get(timeout=10)
        with pytest.raises(zmesh.ActorStoppedError):
            blocked.get(timeout=3)
        assert time.monotonic() - t0 < 3.0
        assert b.count.call_one().get(timeout=10) == 1  # the proc's other actor goes on
    finally:
        procs.stop().get(timeout=20)


def test_a_base_exception_from_the_actor_thread_fails_the_call_typed() -> None:
    # A BaseException kills the actor (Monarch's rule): its call fails at once,
    # typed and naming it, rather than waiting on a thread that is gone.
    one = Threaded.options().as_actor().get(timeout=60)
    try:
        with pytest.raises(zmesh.SupervisionError) as info:
            one.exit.call_one().get(timeout=10)
        assert "KeyboardInterrupt" in str(info.value)
    finally:
        one.stop().get(timeout=20)


def test_a_def_endpoints_answer_leaves_from_its_thread_while_the_loop_is_held(
    tmp_path: Path,
) -> None:
    # The answer is sent by the actor's thread, not handed to the loop: a
    # neighbour holding the loop (an async endpoint that blocks) does not
    # hold it back. Before, it waited for the loop, here the hog's 4 s.
    procs = zmesh.this_host().spawn_procs(per_host={"procs": 1}).get(timeout=60)
    try:
        a = procs.spawn("a", Threaded).get(timeout=30)
        h = procs.spawn("h", LoopHog).get(timeout=30)
        started, hogging = tmp_path / "started", tmp_path / "hogging"
        answer = a.block.call_one(1.5, str(started))
        wait_for(started.exists, 10, "the def endpoint to start")
        hogged = h.hog.call_one(4.0, str(hogging))
        wait_for(hogging.exists, 10, "the loop to be held")
        t0 = time.monotonic()
        assert answer.get(timeout=10) == 1.5
        assert not hogged.done(), "the answer waited for the loop"
        assert time.monotonic() - t0 < 3.0
        assert hogged.get(timeout=10) == 4.0
        assert a.count.call_one().get(timeout=10) == 1  # and the actor goes on
    finally:
        procs.stop().get(timeout=20)

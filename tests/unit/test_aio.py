"""The private parts of asyncio that zmesh relies on still do what zmesh needs.

If one of these fails on a new Python, zmesh/_shared/aio.py is the one place
to change.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import pytest

from zmesh._shared import aio


def test_running_loop_is_none_outside_a_loop_and_the_loop_inside() -> None:
    assert aio.running_loop() is None

    async def inside() -> asyncio.AbstractEventLoop | None:
        return aio.running_loop()

    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(inside()) is loop
    finally:
        loop.close()


def test_entering_a_task_makes_it_the_current_task_until_left() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        other = loop.create_task(asyncio.sleep(10))
        me = asyncio.current_task()
        seen: list[asyncio.Task[object] | None] = []

        def as_other() -> None:  # a plain callback, run outside any task
            aio.enter_task(loop, other)
            try:
                seen.append(asyncio.current_task(loop))
            finally:
                aio.leave_task(loop, other)
            seen.append(asyncio.current_task(loop))

        loop.call_soon(as_other)
        await asyncio.sleep(0.01)
        assert seen == [other, None]
        assert asyncio.current_task() is me
        other.cancel()

    asyncio.run(main())


def test_a_pending_task_of_a_closed_loop_is_forgotten_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.new_event_loop()
    task = loop.create_task(asyncio.sleep(10))
    loop.run_until_complete(asyncio.sleep(0))  # the task starts and waits
    loop.close()
    aio.forget_pending(task)
    del task
    with caplog.at_level("ERROR", logger="asyncio"):
        gc.collect()
    assert not [r for r in caplog.records if "destroyed but it is pending" in r.getMessage()]


def test_a_callback_queued_quietly_from_a_thread_waits_for_the_loops_next_wake() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        loop.set_debug(True)  # (where call_soon refuses other threads)
        start = time.monotonic()
        ran = loop.create_future()

        def queue() -> None:
            time.sleep(0.05)  # the loop is asleep in its selector by now
            aio.call_soon_quietly(loop, lambda: ran.set_result(time.monotonic() - start))

        thread = threading.Thread(target=queue)
        thread.start()
        # The only wake-ups: these timers. The callback waits for the first.
        loop.call_later(0.5, lambda: None)
        loop.call_later(2.0, lambda: None)
        try:
            return await ran
        finally:
            thread.join()

    assert asyncio.run(main()) >= 0.45

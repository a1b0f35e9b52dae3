"""An actor's own worker thread, for its sync endpoints: a cheaper hand-off than the pool.

A ``def`` endpoint runs outside the event loop so that, while it blocks, the
proc's other actors and its heartbeats go on. Through the proc's pool
(``zmesh._shared.workers``) each call costs an executor work item, a
``concurrent.futures.Future`` chained to an asyncio one, and two task
wake-ups; on a loaded 2-core machine that was ~1.8x the round trip of an
``async def`` endpoint.

An actor runs one message at a time, so one thread of its own is enough
for its ``def`` endpoints: ``run`` puts the call on a ``SimpleQueue`` the
thread waits on, and the thread hands the result back with one
``call_soon_threadsafe``, which resolves the future (and, when the mailbox
drives the message itself, finishes it there: ``Mailbox.step``). Work never
waits behind the thread: while it is busy (a blocking endpoint the actor
was stopped out of, a ``def`` health check beside a running call) the call
goes to the pool as before, so a blocked thread here stops nothing else
and the pool's rules (it grows only when its threads are blocked, not
while the machine is merely starved) hold for everything else.

A proc starts at most ``ZMESH_ACTOR_THREADS`` (64) of these threads at
once, read when one is about to start: the actors past that (a proc of a
thousand actors) share the pool, as every actor did before.
"""

from __future__ import annotations

import asyncio
import os
import threading
from queue import SimpleQueue
from typing import Any

# The future a call's result resolves, the function and its arguments.
_Item = tuple["asyncio.Future[Any]", Any, tuple[Any, ...]]

DEFAULT_LIMIT = 64


def limit() -> int:
    """How many actor threads a proc may have at once (``ZMESH_ACTOR_THREADS``)."""
    try:
        return max(0, int(os.environ.get("ZMESH_ACTOR_THREADS", DEFAULT_LIMIT)))
    except ValueError:
        return DEFAULT_LIMIT


class ActorThread:
    """One actor's worker thread (started on its first sync call, ended by ``close``)."""

    __slots__ = ("busy", "done", "future", "loop", "name", "queue", "thread")

    live = 0  # threads of this process started and not yet closed (the loop's thread counts)

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self.loop = loop
        self.name = name
        self.queue: SimpleQueue[_Item | None] = SimpleQueue()
        self.thread: threading.Thread | None = None
        self.busy = False  # a call is in the thread (set and cleared in the loop's thread)
        self.future: asyncio.Future[Any] | None = None  # that call's
        # Called in the loop's thread once the future is resolved (Mailbox.step
        # sets it to finish the message there, with no task wake-up).
        self.done: Any = None

    def free(self) -> bool:
        """Whether a call may run here now: not busy, and its thread is
        running or may start (fewer than ``limit()`` run in this process)."""
        if self.busy:
            return False
        return self.thread is not None or ActorThread.live < limit()

    def run(self, fn: Any, *args: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` in this thread (it must be ``free``); its future."""
        fut = self.loop.create_future()
        self.busy = True
        self.future = fut
        self.queue.put((fut, fn, args))
        if self.thread is None:
            self.thread = threading.Thread(
                target=self._main, name=f"zmesh-actor-{self.name}", daemon=True
            )
            self.thread.start()
            ActorThread.live += 1
        return fut

    def close(self) -> None:
        """End the thread once the call in it (if any) returns."""
        if self.thread is not None:
            self.queue.put(None)
            ActorThread.live -= 1
            self.thread = None

    def _main(self) -> None:
        get, call_soon = self.queue.get, self.loop.call_soon_threadsafe
        while True:
            item = get()
            if item is None:
                return
            fut, fn, args = item
            try:
                result, error = fn(*args), None
            except BaseException as exc:  # carried to the loop's thread, as the pool would
                result, error = None, exc
            try:
                call_soon(self._settle, fut, result, error)
            except RuntimeError:  # the loop is closed: the proc is ending
                return
            # Hold nothing of the call while waiting for the next one: an
            # argument kept alive here (a response port the endpoint dropped)
            # would not be seen as dropped until the actor's next sync call.
            del item, fut, fn, args, result, error

    def _settle(self, fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        self.busy = False
        self.future = None
        done, self.done = self.done, None
        if fut.done():  # cancelled: the actor stopped meanwhile
            return
        if error is None:
            fut.set_result(result)
        else:
            fut.set_exception(error)
        if done is not None:
            done()

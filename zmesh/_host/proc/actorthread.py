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

The thread answers a call itself when it can (``Answer``): a result msgpack
carries as it is (``None``, a number, a string, bytes) of a message the
mailbox runs, to a caller on the proc's ROUTER, is encoded and sent right
there, the socket shared under its lock (``AsyncSocket.send_from_thread``),
so the reply does not wait for the loop to wake. The loop is then told
without being woken (``zmesh._shared.aio.call_soon_quietly``): nothing waits
for that but the actor's next message, whose arrival wakes the loop anyway,
and the callback, queued first, settles the call before that message is
read. If a message already waits in the actor's queue (it came while the
thread ran), the thread wakes the loop for it. So a call costs one wake-up
of the thread and none of the loop beyond the caller's message. Exactly
one of the two answers a call: the thread takes the call's
``Running.claim`` before it sends, and the loop before it answers
"stopped" for an actor stopped meanwhile. Anything else
(an error, a cancelled call, a value that is pickled, a response port, a
``concurrent`` endpoint) is answered by the loop as before.

A proc starts at most ``ZMESH_ACTOR_THREADS`` (64) of these threads at
once, read when one is about to start: the actors past that (a proc of a
thousand actors) share the pool, as every actor did before.
"""

from __future__ import annotations

import asyncio
import os
import threading
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any

from zmesh._shared.aio import call_soon_quietly
from zmesh._shared.invoke import Sent
from zmesh._shared.stats import now_ns
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec

if TYPE_CHECKING:
    from zmesh._host.proc.cancelling import Running
    from zmesh._host.proc.mailbox import Mailbox
    from zmesh._wire.zsock import AsyncSocket

# The future a call's result resolves, the function and its arguments, and
# how the thread may answer the call itself (or None).
_Item = tuple["asyncio.Future[Any]", Any, tuple[Any, ...], "Answer | None"]


# Results sent as they are: msgpack carries them in the envelope (or bytes
# as a frame), with no pickling, which may need the loop (a handle in it).
_PLAIN = frozenset((type(None), bool, int, float, str, bytes))


def answer(
    router: AsyncSocket, box: Mailbox, ident: Any, call: w.Call, run: Running, guard: Any
) -> Answer | None:
    """How the actor's thread may answer ``call`` itself, if it may: a
    message of the mailbox's (not a ``concurrent`` one, which ``Mailbox.close``
    answers itself), with a reply, to a caller on the ROUTER (not a group's
    ``Slot``), with no response port to check (``guard``)."""
    if call.oneway or guard is not None or type(ident) is not bytes or run.task is not box.task:
        return None
    router.share()
    return Answer(router, ident, call.id, run, box)


class Answer:
    """How the actor's thread answers one call itself: to whom, on which socket."""

    __slots__ = ("box", "id", "ident", "router", "run")

    def __init__(
        self, router: AsyncSocket, ident: bytes, req: int, run: Running, box: Mailbox
    ) -> None:
        self.router = router
        self.ident = ident
        self.id = req
        self.run = run
        self.box = box

    def send(self, result: Any, codec: Codec) -> bool:
        """Answer with ``result`` now, from the actor's thread; whether it did."""
        if type(result) not in _PLAIN or self.run.cancelled or self.box.stopped:
            return False
        try:
            payload, buffers = Codec.pack_value(result)
            frames = codec.encode(w.Reply(self.id, payload), buffers)
        except Exception:  # the loop says why, as it does for any result
            return False
        return self.router.send_from_thread([self.ident, *frames], self.run.claim)


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

    def run(self, fn: Any, *args: Any, answer: Answer | None = None) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` in this thread (it must be ``free``); its future,
        whose result is a ``Sent`` when ``answer`` sent it from the thread."""
        fut = self.loop.create_future()
        self.busy = True
        self.future = fut
        self.queue.put((fut, fn, args, answer))
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
        codec = Codec(w.PROC_INBOX)  # its own: a codec is not thread-safe
        while True:
            item = get()
            if item is None:
                return
            fut, fn, args, answer = item
            try:
                result, error = fn(*args), None
            except BaseException as exc:  # carried to the loop's thread, as the pool would
                result, error = None, exc
            if answer is not None and error is None and answer.send(result, codec):
                # Answered: the loop goes on with it at its next turn, unwoken,
                # unless the actor's next message is here already.
                call_soon_quietly(self.loop, self._settle, fut, Sent(now_ns()), None)
                if answer.box.queue:
                    try:
                        call_soon(_nothing)
                    except RuntimeError:  # the loop is closed: the proc is ending
                        return
                del item, fut, fn, args, answer, result, error
                continue
            try:
                call_soon(self._settle, fut, result, error)
            except RuntimeError:  # the loop is closed: the proc is ending
                return
            # Hold nothing of the call while waiting for the next one: an
            # argument kept alive here (a response port the endpoint dropped)
            # would not be seen as dropped until the actor's next sync call.
            del item, fut, fn, args, answer, result, error

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


def _nothing() -> None:
    """Wakes the loop (it has work queued already)."""

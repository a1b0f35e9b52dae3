"""An actor's mailbox in its proc: its instance, its queue, and the task that drains it.

``Mailbox`` runs one actor's messages one at a time in arrival order (a
``concurrent`` endpoint's without waiting for the one in progress), starting
a message at once, inside the socket's reader, when the actor is idle;
``Resume`` finishes such a message in the mailbox task when it suspends.
What runs beside the queue (``concurrent`` messages, health checks) is
``sidecalls.py``'s.
The proc's ``ProcServer`` (``proc.py``) owns the mailboxes and runs each
message with its ``handle``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from zmesh._actor import Endpoint, Point, set_actor_name, set_current
from zmesh._host.proc import actordeath as _actordeath
from zmesh._host.proc import bounds as _bounds
from zmesh._host.proc import lifecycle as _lifecycle
from zmesh._host.proc.actorthread import ActorThread
from zmesh._host.proc.batching import Batcher
from zmesh._host.proc.cancelling import Running
from zmesh._host.proc.sidecalls import SideCalls
from zmesh._shared import stats as _stats
from zmesh._shared.aio import enter_task, leave_task, running_loop
from zmesh._wire import messages as w

if TYPE_CHECKING:
    from zmesh._host.proc.procserver import ProcServer

log = logging.getLogger("zmesh.proc")


class Mailbox(SideCalls):
    """One actor: its instance, its queue, and the task that drains it.

    An actor runs one message at a time, in arrival order. A message to a
    ``concurrent`` endpoint starts as soon as nothing queued is ahead of it,
    without waiting for the message in progress (it never overtakes one that
    is still queued).

    When the actor is idle and nothing is queued, a message starts at once,
    inside the socket's reader, as the mailbox task would run it (same
    current task, the actor's context). Most async endpoints finish without
    suspending and reply right there, which saves a task wake-up per
    message. One that suspends (and every sync endpoint, which goes to a
    worker thread) is handed to the mailbox task to finish, and the actor
    stays busy until it has.
    """

    def __init__(
        self, server: ProcServer, name: str, instance: Any, point: Point, label: str = ""
    ) -> None:
        self.server = server
        self.name = name  # its key in the proc (``group#k`` for one of a group)
        self.label = label or name  # current_actor_name(): the name it was spawned as
        self.instance = instance
        self.point = point
        self.queue: deque[tuple[bytes, w.Call, list[Any]]] = deque()
        self.sizes: deque[int] = deque()  # each queued call's bytes (zmesh._host.proc.bounds)
        # Set while the mailbox task waits for mail; put() resolves it.
        self.waiter: asyncio.Future[None] | None = None
        # An eagerly started message that suspended, for the task to finish:
        # (coroutine, what it yielded, an exception to throw into it first).
        self.handoff: tuple[Any, Any, BaseException | None] | None = None
        self.context: contextvars.Context | None = None  # the actor's, set by _run
        self.endpoints: dict[str, Endpoint[Any, Any]] = {}
        for klass in type(instance).__mro__:
            for attr, value in vars(klass).items():
                if isinstance(value, Endpoint) and attr not in self.endpoints:
                    self.endpoints[attr] = value
        self.counters = {n: _stats.EndpointCounters(n) for n in self.endpoints}
        # Batched endpoints' calls go to their batcher, not the mailbox.
        self.batchers = {
            n: Batcher(server, instance, ep, self.counters[n], None)
            for n, ep in self.endpoints.items()
            if ep.info.batch
        }
        self.queue_peak = 0
        self.busy = False
        # Held (busy) while a worker thread runs this actor's part of a fan-out
        # (zmesh._host.proc.groupfast): its task leaves the queue alone until release().
        self.held = False
        # That part, to fail if the actor stops meanwhile: (its gather, index, method).
        self.part: tuple[Any, int, str] | None = None
        # Running ``concurrent`` messages, with the call each answers.
        self.running: dict[asyncio.Task[None], tuple[bytes, w.Call]] = {}
        # Every call running now, by (caller, request id), for its caller to
        # cancel (zmesh._host.proc.cancelling).
        self.active: dict[tuple[bytes, int], Running] = {}
        # Set by close(): a message cancelled from now on was running when the
        # actor stopped, and its caller is answered "stopped" (ProcServer.handle),
        # unless close() answered it already (``told``: (ident, request id)).
        self.stopped = False
        self.told: set[tuple[bytes, int]] = set()
        # Set when the actor died (zmesh._host.proc.actordeath): the failure every
        # call of it gets from then on; and who asked to hear of that death.
        self.dead = ""
        self.watchers: list[tuple[bytes, int]] = []
        # The ``__health__`` check running now, and the one waiting for it (at
        # most one of each: see ``_check``).
        self.checking: asyncio.Task[None] | None = None
        self.next_check: tuple[bytes, w.Call, list[Any]] | None = None
        self.task = asyncio.ensure_future(self._run())
        # Its sync endpoints' own worker thread (zmesh._host.proc.actorthread), and the
        # message waiting for it that ``step`` finishes when it is done.
        self.thread = ActorThread(self.task.get_loop(), name)
        self.driving: Any = None

    def put(self, ident: bytes, call: w.Call, frames: list[Any]) -> None:
        if self.dead:
            _actordeath.dead_reply(self.server, ident, call, self)
            return
        if self.batchers and call.method in self.batchers:
            self.batchers[call.method].add(ident, call, frames)
            return
        if call.method == "__health__" and self.context is not None:
            self._check(ident, call, frames)
            return
        if not self.queue and self.context is not None:
            ep = self.endpoints.get(call.method)
            if ep is not None and ep.info.concurrent:
                # Nothing is ahead of it in arrival order, so it starts now,
                # even while a non-concurrent call is in progress.
                self._start_concurrent(ident, call, frames)
                return
            if self.waiter is not None and not self.busy and ep is not None:
                # A sync endpoint starts the same way: handle() hands it to a
                # worker thread and suspends, and the actor is busy from now.
                self._start(ident, call, frames)
                return
        self.queue.append((ident, call, frames))
        nbytes = _bounds.call_bytes(call, frames)
        self.sizes.append(nbytes)
        self.server.took(nbytes)
        if len(self.queue) > self.queue_peak:
            self.queue_peak = len(self.queue)
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _start(self, ident: bytes, call: w.Call, frames: list[Any]) -> None:
        """Run a message up to its first suspension, now, as the mailbox task."""
        self.step(self.server.handle(self, ident, call, frames), call.method)

    def step(self, coro: Any, method: str) -> None:
        """Run ``coro`` (a message's handling, of ``method``) up to its first
        suspension, now, as the mailbox task; the task finishes it from there.
        The actor must be idle (its task waiting, nothing queued).

        A suspension on this actor's own thread (a sync endpoint running in
        it) is the exception: the thread's result comes back in one loop
        callback, which goes on with the message right there (``_resume``),
        with no task wake-up in between. The actor is held meanwhile, so its
        later mail queues."""
        assert self.context is not None  # the task is waiting, so _run set it
        loop = self.task.get_loop()
        enter_task(loop, self.task)  # asyncio.current_task() is the actor's task, as in _run
        try:
            yielded = self.context.run(coro.send, None)
        except StopIteration:
            self._ended()
            return  # done, reply sent
        except Exception:
            log.exception("handling %s.%s failed", self.name, method)
            self._ended()
            return
        finally:
            leave_task(loop, self.task)
        self.busy = True
        if yielded is self.thread.future and yielded is not None:
            self.held = True
            self.driving = (coro, method)
            self.thread.done = self._resume
            return
        # It awaits something: the mailbox task finishes it; later mail queues.
        self.handoff = (coro, yielded, None)
        self._wake()

    def _resume(self) -> None:
        """The actor's thread is done with the message ``step`` left there: go on with it."""
        (coro, method), self.driving = self.driving, None
        self.held = False
        self.step(coro, method)

    def _ended(self) -> None:
        """A message ``step`` ran is done: the actor is idle; its task goes on with the queue."""
        if self.busy:  # it had waited for the actor's thread
            self.busy = False
            if self.queue:
                self._wake()

    def statistics(self) -> _stats.ActorStatistics:
        """This actor's mailbox and endpoint counters, as a frozen record."""
        return _stats.actor_statistics(
            self.name, type(self.instance).__qualname__, self.counters.values(),
            (c.method for _, c, _ in self.queue), self.queue_peak,
        )  # fmt: skip

    def _enter(self) -> None:
        """Make the running context this actor's: what ``current_rank()``,
        ``current_actor_name()`` and ``context()`` read."""
        set_current(self.point, self.instance)
        set_actor_name(self.label)

    def actor_context(self) -> contextvars.Context:
        """A context of this actor's own, as its endpoints see it (``__cleanup__`` runs in one)."""
        if self.context is not None:
            return self.context.copy()
        ctx = contextvars.copy_context()  # the task has not started yet
        ctx.run(self._enter)
        ctx.run(set_current, request="")
        return ctx

    async def _run(self) -> None:
        self._enter()
        self.context = contextvars.copy_context()
        for batcher in self.batchers.values():
            batcher.context = self.context
        loop = asyncio.get_running_loop()
        while True:
            if self.handoff is not None:
                coro, yielded, exc = self.handoff
                self.handoff = None
                try:
                    await Resume(coro, self.context, yielded, exc)
                except GeneratorExit:
                    if not self._stepping():
                        raise  # this task is being closed
                    # A future the endpoint awaited failed with GeneratorExit:
                    # the task threw it here, and Python closed the endpoint
                    # on the way (which answered its call). The actor goes on.
                except (Exception, asyncio.CancelledError) as err:
                    self._failed(err, "a message")
                finally:
                    self.busy = False
                continue
            if not self.queue or self.held:
                self.waiter = loop.create_future()
                try:
                    await self.waiter
                except asyncio.CancelledError as cancel:
                    if self.handoff is None:
                        raise
                    # Cancelled (the actor stops, or the endpoint cancelled
                    # this task) before the handed-off message resumed: the
                    # message gets the cancellation, as it would have here.
                    self.handoff = (self.handoff[0], None, cancel)
                finally:
                    self.waiter = None
                continue
            if self.dead:  # (kill() failed what was queued; nothing more runs)
                self.queue.clear()
                continue
            ident, call, frames = self.queue.popleft()
            self.server.started(self.sizes.popleft())
            ep = self.endpoints.get(call.method)
            if ep is not None and ep.info.concurrent:
                self._start_concurrent(ident, call, frames)
            else:
                self.busy = True
                try:
                    await self.server.handle(self, ident, call, frames)
                except GeneratorExit:
                    if not self._stepping():
                        raise
                except (Exception, asyncio.CancelledError) as err:
                    self._failed(err, call.method)
                finally:
                    self.busy = False

    def _failed(self, err: BaseException, what: str) -> None:
        """Handling ``what`` let ``err`` out: only the actor's own stop (its task
        cancelled) ends this task; anything else is logged, and the actor goes on
        with its next message."""
        if _lifecycle.cancelled(err):
            raise err
        log.error("handling %s of %s failed; the actor goes on", what, self.name, exc_info=err)

    def _stepping(self) -> bool:
        """Whether this task is running now: a ``GeneratorExit`` that reaches
        ``_run`` then came from a failed future, not from closing the task."""
        loop = running_loop()
        return loop is not None and asyncio.current_task(loop) is self.task

    def close(self) -> asyncio.Future[Any] | None:
        """Stop the actor: its queued calls fail, its ``__cleanup__`` starts
        (once, as the actor); what to wait for to see that cleanup done.

        Every call of the actor ends now: the queued ones fail here, and the
        running ones (the message in progress, ``concurrent`` ones, open
        streams) are cancelled, which answers each of them "stopped".
        """
        self.stopped = True
        if self.driving is not None:
            # Its sync endpoint runs on in the actor's thread: the task gets the
            # message, to throw its cancellation in (which answers "stopped").
            self.handoff, self.driving, self.thread.done = (self.driving[0], None, None), None, None
        self.thread.close()
        _actordeath.stopped(self.server, self)
        self.task.cancel()
        if self.part is not None:  # its thread runs on; its answer comes too late to count
            gather, index, method = self.part
            gather.fail(index, "stopped", "ActorStopped", f"actor {self.name} stopped", method)
        for task, (ident, call) in list(self.running.items()):
            # Answered here: a task cancelled before its first step never runs
            # the handler that would answer it.
            self.told.add((ident, call.id))
            self.server.fail(ident, call, "stopped", "ActorStopped", f"actor {self.name} stopped")
            task.cancel()
        for batcher in self.batchers.values():
            batcher.close()
        ending = _lifecycle.cleanup(self, None)
        if isinstance(ending, asyncio.Task):  # keep a reference until it ends
            self.server.spawning.add(ending)
            ending.add_done_callback(self.server.spawning.discard)
        for (ident, call, _), nbytes in zip(self.queue, self.sizes, strict=True):
            self.server.fail(ident, call, "stopped", "ActorStopped", f"actor {self.name} stopped")
            self.server.started(nbytes)
        self.queue.clear()
        self.sizes.clear()
        if self.next_check is not None:
            self._skip_check(self.next_check, f"actor {self.name} stopped")
            self.next_check = None
        return ending


class Resume:
    """Finish ``coro``, which ``Mailbox._start`` ran until it yielded ``yielded``.

    This is ``yield from`` (PEP 380) written out, so that every step of
    ``coro`` runs in the actor's ``context`` as its first step did; the
    awaiting task's sends and throws (a cancellation) pass through to it.
    ``throw``, when given, is thrown in first instead of waiting on ``yielded``.
    """

    __slots__ = ("context", "coro", "throw", "yielded")

    def __init__(
        self, coro: Any, context: contextvars.Context, yielded: Any, throw: BaseException | None
    ) -> None:
        self.coro = coro
        self.context = context
        self.yielded = yielded
        self.throw = throw

    def __await__(self) -> Generator[Any, Any, None]:
        coro, context, yielded, exc = self.coro, self.context, self.yielded, self.throw
        sent = None
        while True:
            if exc is None:
                try:
                    sent = yield yielded
                except GeneratorExit:
                    coro.close()
                    raise
                except BaseException as thrown:  # a cancellation: pass it on
                    exc = thrown
            try:
                if exc is None:
                    yielded = context.run(coro.send, sent)
                else:
                    yielded = context.run(coro.throw, exc)
            except StopIteration:
                return
            exc = None

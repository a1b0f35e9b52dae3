"""What runs beside an actor's queue: ``concurrent`` messages, ``__health__`` checks, fan-out parts.

A part of ``Mailbox`` (``mailbox.py``), which runs an actor's messages one
at a time in arrival order. A ``concurrent`` endpoint's message starts as a
task of its own, a ``__health__`` check runs beside the queue (one at a
time), and a fan-out's part run in a worker thread (``groupfast.py``) holds
the actor busy outside its task until it ends.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from zmesh._wire import messages as w

if TYPE_CHECKING:
    import contextvars
    from collections import deque

    from zmesh._host.proc.procserver import ProcServer


class SideCalls:
    """The calls of an actor that do not wait in its queue."""

    if TYPE_CHECKING:  # the Mailbox's, which this is a part of
        server: ProcServer
        name: str
        context: contextvars.Context | None
        task: asyncio.Task[None]
        queue: deque[tuple[bytes, w.Call, list[Any]]]
        busy: bool
        held: bool
        part: tuple[Any, int, str] | None
        running: dict[asyncio.Task[None], tuple[bytes, w.Call]]
        checking: asyncio.Task[None] | None
        next_check: tuple[bytes, w.Call, list[Any]] | None

        def _wake(self) -> None: ...

    def hold(self, part: tuple[Any, int, str] | None = None) -> None:
        """The actor is busy with work run outside its task (it must be idle now):
        ``part`` of a fan-out (its gather, index and method), answered "stopped"
        at once if the actor stops before it ends."""
        self.busy = self.held = True
        self.part = part

    def release(self) -> None:
        """That work is done: the task goes on with the queue."""
        self.busy = self.held = False
        self.part = None
        if self.queue:
            self._wake()

    def _start_concurrent(
        self, ident: bytes, call: w.Call, frames: list[Any]
    ) -> asyncio.Task[None]:
        """Start a ``concurrent`` endpoint's message as a task of its own."""
        assert self.context is not None
        # The task copies the context current when it is made: the actor's.
        coro = self.server.handle(self, ident, call, frames)  # type: ignore[arg-type]  # a Mailbox
        task = self.context.run(asyncio.ensure_future, coro)
        self.running[task] = (ident, call)  # keep a reference until it ends
        self.server.took()
        task.add_done_callback(self._concurrent_done)
        return task

    def _check(self, ident: bytes, call: w.Call, frames: list[Any]) -> None:
        """Run a ``__health__`` check beside the mailbox, never behind it: a
        replica busy with a queue of slow requests is alive, and says so.

        One check at a time: the supervisor sends one every interval whether
        the last answered or not, so a check that never returns would leave
        a task (a worker thread, for a ``def`` check) per interval, for ever.
        A check that comes while one runs waits for it; a newer one replaces
        it, and the replaced caller is told as if no reply came in time.
        """
        if self.checking is None:
            self.checking = self._start_concurrent(ident, call, frames)
            self.checking.add_done_callback(self._check_done)
            return
        if self.next_check is not None:
            self._skip_check(self.next_check, "a newer check replaced it")
        self.next_check = (ident, call, frames)

    def _check_done(self, task: asyncio.Task[None]) -> None:
        self.checking = None
        waiting, self.next_check = self.next_check, None
        if waiting is None:
            return
        if task.cancelled() or self.task.done():  # the actor stops
            self._skip_check(waiting, f"actor {self.name} stopped")
        else:
            self._check(*waiting)

    def _skip_check(self, check: tuple[bytes, w.Call, list[Any]], why: str) -> None:
        """Answer a check that will not run (its caller reads ``CallTimeoutError``)."""
        ident, call, _ = check
        self.server.fail(
            ident, call, "deadline", "HealthCheckSkipped",
            f"not run: the check before it has not returned ({why})",
        )  # fmt: skip

    def _concurrent_done(self, task: asyncio.Task[None]) -> None:
        self.running.pop(task, None)
        self.server.started()

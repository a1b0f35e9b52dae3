"""A caller cancels a call: ``CancelCall`` reaches the actor in its proc.

A caller that cancels a call (``Future.cancel()``, its awaiting task
cancelled, Ctrl+C in ``.get()``) sends ``CancelCall`` on the connection the
call went out on, so it arrives after the call. Then:

* a call still queued in its actor's mailbox is dropped;
* a running ``async`` endpoint is cancelled (``CancelledError`` where it
  awaits; its ``finally`` and ``except`` blocks run);
* a running sync endpoint cannot be interrupted (Python has no way to stop a
  thread): it is marked, runs to its end, and its result is dropped.

Each is answered with a ``Failure`` of kind ``cancelled`` once it has ended,
which the caller no longer waits for but reads as "the actor is free again"
(a later timeout behind a call that still runs says so).

``handle`` (``zmesh._host.proc.procserver``) registers each running call in its
mailbox's ``active`` as a ``Running``; ``cancel`` finds it there or in the
queue.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from zmesh._wire import messages as w

if TYPE_CHECKING:
    from zmesh._host.proc.mailbox import Mailbox
    from zmesh._host.proc.procserver import ProcServer

log = logging.getLogger("zmesh.proc")

# What a call cancelled by its caller is answered with (a ``Failure``'s type).
CANCELLED = "CallCancelled"


class Running:
    """One call an actor runs now: the task it runs in, and whether its caller cancelled it."""

    __slots__ = ("_answer", "cancelled", "is_async", "task")

    def __init__(self, task: asyncio.Task[Any] | None, is_async: bool) -> None:
        self.task = task
        self.is_async = is_async
        self.cancelled = False
        self._answer = [True]  # taken by whoever answers a sync call (see ``claim``)

    def claim(self) -> bool:
        """Take the right to answer this call; whether it was still there.

        A sync call may be answered from its actor's thread
        (``zmesh._host.proc.actorthread``) while the loop stops the actor: each
        side claims first, so exactly one answers. ``list.pop`` is one step
        under the GIL, so the two threads cannot both take it.
        """
        try:
            self._answer.pop()
        except IndexError:
            return False
        return True

    def settle(self) -> None:
        """The call has ended after its cancel: take back the task's cancel request,
        so the task (the actor's, which goes on with its next message) is not
        taken for one being stopped."""
        task = self.task
        if self.is_async and task is not None:
            # Python 3.11+ counts cancel requests; 3.10 forgets one once delivered.
            uncancel = getattr(task, "uncancel", None)
            cancelling = getattr(task, "cancelling", None)
            if uncancel is not None and cancelling is not None and cancelling() > 0:
                uncancel()


def cancel(server: ProcServer, ident: bytes, msg: w.CancelCall) -> None:
    """Cancel call ``msg.id`` that ``ident`` sent to ``msg.actor``, wherever it is."""
    box = server.actors.get(msg.actor)
    if box is None:
        return  # the actor is gone: its calls were answered "stopped"
    run = box.active.get((ident, msg.id))
    if run is not None:
        if not run.cancelled:
            run.cancelled = True
            server.cancels += 1
            if run.is_async and run.task is not None:
                run.task.cancel()
        return
    if _unqueue(server, box, ident, msg.id):
        server.cancels += 1
    # Otherwise it ended already (its answer is on the way), or is a kind of
    # call that cannot be cancelled one by one (a batch's, a fan-out's part).


def _unqueue(server: ProcServer, box: Mailbox, ident: bytes, req: int) -> bool:
    """Drop call ``req`` of ``ident`` from ``box``'s queue, answered; whether it was there."""
    for i, (who, call, _) in enumerate(box.queue):
        if call.id == req and who == ident:
            del box.queue[i]
            nbytes = box.sizes[i]
            del box.sizes[i]
            server.started(nbytes)
            server.fail(ident, call, "cancelled", CANCELLED, "cancelled before it ran")
            return True
    return False


def answer(server: ProcServer, ident: bytes, call: w.Call, run: Running) -> None:
    """A cancelled call has ended: its result (or error) is dropped, and its caller told."""
    run.settle()
    how = "cancelled by its caller" + ("" if run.is_async else "; its result dropped")
    server.fail(ident, call, "cancelled", CANCELLED, how)

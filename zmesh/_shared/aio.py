"""The few private parts of asyncio zmesh relies on, in one place, each with its reason.

zmesh runs its sockets and its actors on plain asyncio and needs four things
asyncio keeps private. They live here, behind names of ours, so a Python
that changes them breaks one module and one test
(tests/unit/test_aio.py), loudly, not a call path silently:

* ``running_loop()``: the running loop or ``None``, without the exception
  ``asyncio.get_running_loop()`` raises and catches on every call from a
  plain thread (the sync ``.get()`` path asks once per call).
* ``enter_task()`` / ``leave_task()``: a proc runs an idle actor's message up
  to its first ``await`` at once, in the proc's loop callback, as the actor's
  own task (``asyncio.current_task()`` must be that task, as Monarch's and
  anyio's code inside the endpoint expects); asyncio's C tasks do the same
  for every step through these two functions.
* ``call_soon_quietly()``: a proc's actor thread that has answered its call
  itself tells the loop so without waking it (``zmesh._host.proc.actorthread``):
  ``call_soon_threadsafe`` would write the loop's self-pipe, one more
  wake-up per call for work nothing waits for.
* ``forget_pending()``: a task made just before its loop closed can never
  run; asyncio would log "Task was destroyed but it is pending" at exit.
"""

from __future__ import annotations

import asyncio
import asyncio.tasks
from typing import Any

running_loop = asyncio._get_running_loop  # documented as the fast path for C code
enter_task = asyncio.tasks._enter_task
leave_task = asyncio.tasks._leave_task


def call_soon_quietly(loop: asyncio.AbstractEventLoop, callback: Any, *args: Any) -> None:
    """Have ``loop`` run ``callback(*args)`` at its next turn, from any thread,
    without waking it: whatever wakes it next (a message, a timer, a
    ``call_soon_threadsafe``) runs it, and before the handlers of what woke
    it when it was queued before that (``_ready`` is run in order).

    For work nothing waits on but what will wake the loop anyway. A
    ``deque.append`` is one step under the GIL, so this is safe from another
    thread; ``call_soon`` itself refuses other threads in debug mode.
    """
    loop._call_soon(callback, args, None)  # type: ignore[attr-defined]


def forget_pending(task: asyncio.Task[Any]) -> None:
    """Let ``task``, whose loop has closed, be collected without the "destroyed but pending" log."""
    task._log_destroy_pending = False  # type: ignore[attr-defined]

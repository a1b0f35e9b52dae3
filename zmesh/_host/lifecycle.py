"""An actor's end: ``__cleanup__(self, exc)`` when it stops, however it stops.

``__cleanup__`` (sync or ``async def``) runs once per actor: when the actor
is stopped (``mesh.stop()`` on its actor mesh), when its proc is told to go
(SIGTERM from the agent: the mesh's procs are stopped, or its owner exited),
and when its proc exits because an endpoint raised ``SystemExit`` (then
``exc`` is that exception; otherwise ``None``). A proc that is SIGKILLed or
crashes runs nothing. The agent sends SIGKILL 1.5 s after SIGTERM, so
cleanups get ``CLEANUP_BUDGET`` seconds in all.

How the proc itself ends is here too: ``exit_process`` (as the interpreter
exits, without waiting for endpoint threads), the status ``sys.exit`` asked
for (``exit_code``), and ``cancelled``, which tells the cancellation of an
actor's task apart from a ``CancelledError`` its endpoint raised.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import logging
import os
import signal
import sys
from collections.abc import Iterable
from typing import Any, NoReturn

log = logging.getLogger("zmesh.proc")

CLEANUP_BUDGET = 1.0


def cleanup(instance: Any, exc: BaseException | None) -> Any:
    """Run ``instance.__cleanup__(exc)`` once; an awaitable if it is ``async``."""
    hook = getattr(instance, "__cleanup__", None)
    if hook is None or getattr(instance, "_zmesh_cleaned", False):
        return None
    try:
        instance._zmesh_cleaned = True
    except AttributeError:  # __slots__: it may run twice then, never zero times
        pass
    try:
        result = hook(exc)
    except Exception:
        log.exception("__cleanup__ of %s raised", type(instance).__qualname__)
        return None
    return result if inspect.isawaitable(result) else None


async def cleanup_all(instances: Iterable[Any], exc: BaseException | None) -> None:
    """``__cleanup__`` of every actor, async ones together, within the budget."""
    pending = [a for a in (cleanup(i, exc) for i in instances) if a is not None]
    if not pending:
        return
    tasks = [asyncio.ensure_future(a) for a in pending]
    done, late = await asyncio.wait(tasks, timeout=CLEANUP_BUDGET)
    for t in late:
        t.cancel()
    for t in done:
        if not t.cancelled() and t.exception() is not None:
            log.error("__cleanup__ raised", exc_info=t.exception())


def on_sigterm(server: Any) -> None:
    """Let SIGTERM run every actor's ``__cleanup__``, then end the proc as SIGTERM does.

    Installed once, when the first actor with a ``__cleanup__`` starts: a
    proc without one keeps the default (SIGTERM ends it at once, even with
    its loop busy).
    """
    if getattr(server, "_sigterm_hooked", False):
        return
    server._sigterm_hooked = True
    loop = asyncio.get_running_loop()
    started = False

    def term() -> None:
        nonlocal started
        if started:
            return
        started = True
        task = loop.create_task(_end(server))
        server.spawning.add(task)  # keep a reference until it ends

    loop.add_signal_handler(signal.SIGTERM, term)


async def _end(server: Any) -> None:
    try:
        await cleanup_all([box.instance for box in list(server.actors.values())], None)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # exits with the status the agent expects


def cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` is a real cancellation of the running task (the actor stops).

    A ``CancelledError`` an endpoint raises while its own task is not being
    cancelled (a task of the user's was) is the endpoint's error, not ours.
    """
    if not isinstance(exc, asyncio.CancelledError):
        return False
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    return cancelling is None or cancelling() > 0


def exit_code(exc: SystemExit) -> int:
    """The exit status ``sys.exit(arg)`` means, as the interpreter reads it."""
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


def exit_process(code: int) -> NoReturn:
    """Exit now as the interpreter would (atexit handlers, flushed output),
    without waiting for endpoint threads that may never return."""
    try:
        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)

"""An actor's end: ``__cleanup__(self, exc)`` when it stops, however it stops.

``__cleanup__`` (sync or ``async def``) runs once per actor: when the actor
is stopped (``mesh.stop()`` on its actor mesh), when its proc is told to go
(SIGTERM from the agent: the mesh's procs are stopped, or its owner exited),
and when its proc exits because an endpoint raised ``SystemExit`` (then
``exc`` is that exception; otherwise ``None``). It runs as the actor does
(in its context; a sync one in a worker thread, as a sync endpoint), and
an actor mesh's ``stop()`` answers once it has run. A proc that is
SIGKILLed or crashes runs nothing. The agent sends SIGKILL 1.5 s after SIGTERM, so
cleanups get ``CLEANUP_BUDGET`` seconds in all.

How the proc itself ends is here too: ``exit_process`` (as the interpreter
exits, without waiting for endpoint threads), the status ``sys.exit`` asked
for (``exit_code``), and ``cancelled`` (``zmesh._shared.invoke``'s, where the
rules for running an endpoint are), which tells the cancellation of an
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
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NoReturn

from zmesh._shared.invoke import cancelled as cancelled

if TYPE_CHECKING:
    from zmesh._host.proc.mailbox import Mailbox

log = logging.getLogger("zmesh.proc")

CLEANUP_BUDGET = 1.0


def cleanup(box: Mailbox, exc: BaseException | None) -> asyncio.Future[Any] | None:
    """Start ``__cleanup__(exc)`` of ``box``'s actor, once, as that actor; what to wait for.

    It runs in the actor's own context (``current_rank()``,
    ``current_actor_name()``, ``context()`` and what its endpoints read are
    the actor's) and where its endpoints run: a sync one in a worker thread
    (it may block, and call other actors with ``.get()``), an ``async def``
    one as a task on the proc's loop. ``None`` when there is nothing to run.
    """
    instance = box.instance
    hook = getattr(instance, "__cleanup__", None)
    if hook is None or getattr(instance, "_zmesh_cleaned", False):
        return None
    try:
        instance._zmesh_cleaned = True
    except AttributeError:  # __slots__: it may run twice then, never zero times
        pass
    ctx = box.actor_context()
    loop = asyncio.get_running_loop()
    what = type(instance).__qualname__
    if inspect.iscoroutinefunction(hook):
        try:
            coro = hook(exc)
        except Exception:  # not callable with exc
            log.exception("__cleanup__ of %s raised", what)
            return None
        # The task copies the context it is made in: the actor's.
        return ctx.run(loop.create_task, _awaited(coro, what))
    return loop.run_in_executor(box.server.pool, ctx.run, _run_sync, hook, exc, what, loop)


def cleanup_here(box: Mailbox, loop: asyncio.AbstractEventLoop) -> None:
    """Run a sync ``__cleanup__(None)`` of ``box``'s actor in the calling thread, once.

    For a client's own proc at exit, when the worker pool takes nothing more
    (``cleanup`` would run it there). An ``async def`` one is left to ``cleanup``.
    """
    instance = box.instance
    hook = getattr(instance, "__cleanup__", None)
    if (
        hook is None
        or inspect.iscoroutinefunction(hook)
        or getattr(instance, "_zmesh_cleaned", False)
    ):
        return
    try:
        instance._zmesh_cleaned = True
    except AttributeError:
        pass
    box.actor_context().run(_run_sync, hook, None, type(instance).__qualname__, loop)


async def _awaited(pending: Any, what: str) -> None:
    try:
        await pending
    except Exception:
        log.exception("__cleanup__ of %s raised", what)


def _run_sync(hook: Any, exc: BaseException | None, what: str, loop: Any) -> None:
    """A sync ``__cleanup__``, in a worker thread (and what it returns, if awaitable)."""
    try:
        result = hook(exc)
    except Exception:
        log.exception("__cleanup__ of %s raised", what)
        return
    if inspect.isawaitable(result):  # a sync method that returns a coroutine
        # The loop runs it in this thread's context (the actor's).
        done = asyncio.run_coroutine_threadsafe(_awaited(result, what), loop)
        try:
            done.result(CLEANUP_BUDGET)
        except Exception:
            done.cancel()


async def settle(pending: Iterable[asyncio.Future[Any]]) -> None:
    """Wait for cleanups ``pending`` within the budget; cancel what is late."""
    pending = list(pending)
    if not pending:
        return
    done, late = await asyncio.wait(pending, timeout=CLEANUP_BUDGET)
    for t in late:
        t.cancel()  # an async cleanup stops; a thread's runs on, unwaited
    for t in done:
        if not t.cancelled() and t.exception() is not None:
            log.error("__cleanup__ failed", exc_info=t.exception())


async def cleanup_all(boxes: Iterable[Mailbox], exc: BaseException | None) -> None:
    """``__cleanup__`` of every actor of ``boxes``, all at once, within the budget."""
    await settle([f for f in (cleanup(b, exc) for b in boxes) if f is not None])


def then(server: Any, pending: list[asyncio.Future[Any]], done: Callable[[], None]) -> None:
    """Call ``done`` once cleanups ``pending`` have finished (or their budget is over)."""
    if not pending:
        done()
        return
    task = asyncio.ensure_future(settle(pending))
    server.spawning.add(task)  # keep a reference until it ends

    def finished(t: asyncio.Task[None]) -> None:
        server.spawning.discard(t)
        done()

    task.add_done_callback(finished)


def on_sigterm(server: Any) -> None:
    """Let SIGTERM run every actor's ``__cleanup__``, then end the proc as SIGTERM does.

    Installed once, when the first actor with a ``__cleanup__`` starts: a
    proc without one keeps the default (SIGTERM ends it at once, even with
    its loop busy).
    """
    if getattr(server, "_sigterm_hooked", False):
        return
    if threading.current_thread() is not threading.main_thread():
        # A client's own proc (this_proc()) serves on a thread of its own:
        # no agent sends it SIGTERM, and only the main thread may take signals.
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
        await cleanup_all(list(server.actors.values()), None)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # exits with the status the agent expects


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

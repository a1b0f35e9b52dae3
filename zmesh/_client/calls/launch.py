"""Starting work from any thread on the caller's runtime, and settling its ``Future``.

Every adverb, port and service call starts here: on the runtime's own loop
the work starts at once and its asyncio future is the result; from another
thread it is handed to the loop in send order, and settles the
``concurrent.futures.Future`` that ``.get()`` waits on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

from zmesh._client.calls import runtime as _runtime
from zmesh._client.calls.future import Future
from zmesh._client.calls.inflight import Sink, resolve
from zmesh._client.calls.runtime import ProcRef, Runtime
from zmesh._shared.aio import running_loop

R = TypeVar("R")
_rotation = itertools.count()


def submit(work: Callable[[Runtime], Coroutine[Any, Any, R]]) -> Future[R]:
    """Run ``work(runtime)`` on the caller's runtime; a ``Future`` of its result."""
    rt, here = _runtime.current()
    return run_on(rt, lambda: rt.loop.create_task(work(rt)), here)


def run_on(
    rt: Runtime, start: Callable[[], asyncio.Future[R]], here: bool | None = None
) -> Future[R]:
    """Run ``start()`` on ``rt``'s loop; a ``Future`` of the asyncio future it returns.

    On the loop, that future (a task, say) is the result, so awaiting the
    ``Future`` awaits it. From another thread its outcome is copied to the
    ``concurrent.futures.Future`` that ``.get()`` waits on.

    Args:
        here: whether the caller is on ``rt``'s loop, if it knows.
    """
    if here is None:
        here = running_loop() is rt.loop
    if here:
        return Future(afut=start())
    cfut: concurrent.futures.Future[R] = concurrent.futures.Future()
    rt.dispatch(_start_and_copy, start, cfut, here=False)
    return Future(cfut=cfut)


def _start_and_copy(
    start: Callable[[], asyncio.Future[R]], cfut: concurrent.futures.Future[R]
) -> None:
    if not cfut.set_running_or_notify_cancel():
        return
    try:
        afut = start()
    except BaseException as exc:
        resolve(cfut, False, exc)
        return
    afut.add_done_callback(lambda f: _copy_outcome(f, cfut))


def _copy_outcome(src: asyncio.Future[Any], dst: concurrent.futures.Future[Any]) -> None:
    if src.cancelled():
        resolve(dst, False, concurrent.futures.CancelledError())
    else:
        exc = src.exception()
        resolve(dst, exc is None, src.result() if exc is None else exc)


def on_runtime(
    start: Callable[[Runtime, Sink], None],
    about: tuple[ProcRef | str, str] | None = None,
    targets: Iterable[str] | None = None,
    mesh: Any = None,
) -> Future[R]:
    """Run ``start(runtime, fut)`` on the caller's runtime; it settles ``fut``.

    On the runtime's own loop ``fut`` is an asyncio future. From another
    thread it is the ``concurrent.futures.Future`` that ``.get()`` waits on,
    settled straight from the loop: no asyncio future or callback between.
    ``targets`` are the addresses of the procs it sends to (``None``: unknown);
    ``mesh`` the actor mesh of an endpoint call (see ``Future``).
    """
    rt, here = _runtime.current()
    if here:
        afut: asyncio.Future[R] = rt.loop.create_future()
        start(rt, afut)
        return Future(afut=afut, about=about, mesh=mesh)
    # A plain callback, not a task: it keeps its place in send order (a task
    # would start one turn later and be overtaken by a later broadcast).
    cfut: concurrent.futures.Future[R] = concurrent.futures.Future()
    rt.dispatch(_start_threadsafe, rt, start, cfut, here=False, targets=targets)
    return Future(cfut=cfut, about=about, mesh=mesh)


def _start_threadsafe(
    rt: Runtime, start: Callable[[Runtime, Sink], None], cfut: concurrent.futures.Future[Any]
) -> None:
    if not cfut.set_running_or_notify_cancel():
        return  # cancelled before it was sent
    try:
        start(rt, cfut)
    except BaseException as exc:
        resolve(cfut, False, exc)


def least_loaded(rt: Runtime, refs: list[Any]) -> Any:
    """The ref of ``refs`` with the fewest calls in flight from ``rt`` (``choose``, ``send``)."""
    start = next(_rotation) % len(refs)  # rotate among equals
    best, load = None, None
    for k in range(len(refs)):
        ref = refs[(start + k) % len(refs)]
        c = rt.conns.get(ref.addr)
        if c is not None and c.broken is not None:
            continue
        n = c.inflight if c is not None else 0
        if load is None or n < load:
            best, load = ref, n
    return best if best is not None else refs[start]

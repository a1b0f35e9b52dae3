"""Calls made before a mesh is ready: they wait in order, then go out.

``spawn_procs``, ``spawn`` and ``as_actor`` return their mesh at once while
the procs and actors start in the background. A call on such a mesh (or on a
slice of it) cannot go out yet: it has no proc addresses. It is queued on
the mesh's ``Gate`` and the caller gets its future (or stream) at once. When
the spawn finishes, each runtime's queue is sent in call order; when every
queue is empty the gate closes and calls take the fast path again. A spawn
that failed leaves the gate shut: every call fails with its ``SpawnError``.

A call whose *arguments* hold a mesh that is not ready waits the same way
(the mesh is pickled only once its procs are known), on a gate of the mesh
it calls, so later calls from the same sender cannot overtake it.

Invariants: a runtime's queue is only ever drained on that runtime's loop
thread (items run in order there, as the fast path would have sent them);
a non-empty queue is always either being drained, scheduled to be, or
waiting on a readiness whose callback schedules it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from zmesh._client.calls import runtime as _runtime
from zmesh._client.calls.future import Future
from zmesh._errors import CallTimeoutError

if TYPE_CHECKING:
    from zmesh._client.calls.runtime import ProcRef, Runtime
    from zmesh._client.handles.mesh import _MeshBase

log = logging.getLogger("zmesh")

Ready = concurrent.futures.Future  # settles (None, or the spawn's error) once


class NotReady(Exception):
    """Raised while pickling a mesh whose spawn is still under way."""

    def __init__(self, ready: Ready[None]) -> None:
        super().__init__("the mesh is still spawning")
        self.ready = ready


_state = threading.local()


def draining() -> bool:
    """Whether this thread is sending a queued call now (adverbs then skip the gate)."""
    return getattr(_state, "draining", False)


def for_plain_code() -> bool:
    """Whether the queued call being sent now was made by plain code (no event loop)."""
    return getattr(_state, "plain", False)


class _Item:
    """One queued call: ``redo`` makes it again, for real, once nothing blocks it."""

    __slots__ = ("kind", "redo", "sink")

    def __init__(self, redo: Callable[[], Any], kind: str, sink: Any) -> None:
        self.redo = redo
        self.kind = kind  # "future", "stream" or "broadcast"
        self.sink = sink  # the caller's future (of the result, or of the stream); None

    def cancelled(self) -> bool:
        # Cancelled, or timed out (``_expire``) while it waited: never sent.
        return self.sink is not None and self.sink.done()

    def fail(self, exc: BaseException) -> None:
        sink = self.sink
        if sink is None:
            log.warning("a broadcast queued before its mesh was ready is dropped: %s", exc)
        elif not sink.done():
            sink.set_exception(exc)

    def settle(self, result: Any) -> None:
        sink = self.sink
        if sink is None or sink.done():
            return
        if self.kind == "stream":
            sink.set_result(result)
            return
        inner = result._afut  # made on this runtime's loop: an asyncio future
        if inner is None:  # pragma: no cover - adverbs on the loop make asyncio futures
            inner = asyncio.wrap_future(result._cfut)
        inner.add_done_callback(_copy_into(sink))
        if isinstance(sink, asyncio.Future):
            sink.add_done_callback(lambda f: inner.cancel() if f.cancelled() else None)


def _copy_into(sink: Any) -> Callable[[asyncio.Future[Any]], None]:
    """A done-callback copying an asyncio future's outcome into ``sink``."""

    def copy(inner: asyncio.Future[Any]) -> None:
        if sink.done():
            return
        if inner.cancelled():
            sink.cancel()
        elif (exc := inner.exception()) is not None:
            sink.set_exception(exc)
        else:
            sink.set_result(inner.result())

    return copy


class Gate:
    """The calls waiting for one spawned mesh (shared by its slices), per runtime.

    Args:
        ready: the spawn's readiness; ``None`` for a mesh that is ready and
            only waits for meshes in the arguments of its calls.
    """

    def __init__(self, ready: Ready[None] | None) -> None:
        self.ready = ready
        self._lock = threading.Lock()
        self._queues: dict[Runtime, deque[_Item]] = {}
        self._members: weakref.WeakSet[_MeshBase] = weakref.WeakSet()
        self._by_rank: dict[int, ProcRef] | None = None if ready is not None else {}
        if ready is not None:  # with nothing queued, the gate closes when the spawn is up
            ready.add_done_callback(lambda _: self._settled())

    def _settled(self) -> None:
        with self._lock:
            self._close_if_clear()

    def join(self, mesh: _MeshBase) -> None:
        """Make ``mesh`` (the spawned mesh, or a slice of it) wait with this gate.

        Its proc refs are filled in when the spawn has them (at once if it has).
        """
        with self._lock:
            if self._by_rank is not None and not mesh._refs and self.ready is not None:
                mesh._refs = [self._by_rank[r] for r in mesh._shape.ranks]
            self._members.add(mesh)
            mesh._gate = self

    def fill(self, refs: list[ProcRef]) -> None:
        """The spawn is up: give every member its refs (before ``ready`` settles)."""
        with self._lock:
            # By place in the mesh: an actor's ref says its proc's rank,
            # which several actors of one proc share.
            self._by_rank = {r.point if r.point >= 0 else r.rank: r for r in refs}
            for m in list(self._members):
                m._refs = [self._by_rank[r] for r in m._shape.ranks]

    def submit(self, rt: Runtime, home: bool, item: _Item) -> None:
        with self._lock:
            queue = self._queues.get(rt)
            if queue is None:
                queue = self._queues[rt] = deque()
            queue.append(item)
            first = len(queue) == 1
        if not first:
            return  # whoever drains this queue (or will) gets to it, in order
        if home:
            self._drain(rt)
        else:
            rt.loop.call_soon_threadsafe(self._drain, rt)

    def _drain(self, rt: Runtime) -> None:
        while True:
            with self._lock:
                queue = self._queues.get(rt)
                if not queue:
                    self._queues.pop(rt, None)
                    self._close_if_clear()
                    return
                item = queue[0]
            blocker = self._run(item)
            if blocker is not None:
                blocker.add_done_callback(lambda _: _schedule(rt, self._drain))
                return
            with self._lock:
                queue.popleft()

    def _run(self, item: _Item) -> Ready[None] | None:
        """Send ``item`` (or fail it); what it still waits for, if anything."""
        if item.cancelled():
            return None  # a call cancelled while it waited is never sent
        ready = self.ready
        if ready is not None:
            if not ready.done():
                return ready
            exc = ready.exception()
            if exc is not None:
                item.fail(exc)
                return None
        _state.draining = True
        _state.plain = isinstance(item.sink, concurrent.futures.Future)
        try:
            result = item.redo()
        except NotReady as wait:
            return wait.ready
        except Exception as exc:
            item.fail(exc)
            return None
        finally:
            _state.draining = _state.plain = False
        item.settle(result)
        return None

    def _close_if_clear(self) -> None:
        # Under the lock. A spawn that failed keeps its gate: calls fail fast.
        if self._queues:
            return
        ready = self.ready
        if ready is not None and not (ready.done() and ready.exception() is None):
            return
        for m in list(self._members):
            if m._gate is self:
                m._gate = None


def _schedule(rt: Runtime, fn: Callable[[Runtime], None]) -> None:
    try:
        rt.loop.call_soon_threadsafe(fn, rt)
    except RuntimeError:  # the caller's loop is closed: nobody waits for its calls
        pass


def defer(
    mesh: _MeshBase,
    redo: Callable[[], Any],
    kind: str,
    about: Any = None,
    called: Any = None,
    timeout: float | None = None,
) -> Any:
    """Queue a call on ``mesh`` until nothing blocks it; what the caller holds now.

    ``called`` is the actor mesh of an endpoint call (see ``Future``). A call
    with a ``timeout`` has it from now, not from when it goes out: if its
    mesh is not ready in time it fails with ``CallTimeoutError`` and is never
    sent (a mesh that never becomes ready must not hold its caller for ever).

    Returns:
        a ``Future`` (kind ``"future"``), a stream (``"stream"``) or ``None``
        (``"broadcast"``).
    """
    rt, home = _runtime.current()
    gate = mesh._gate
    if gate is None:  # a ready mesh, blocked by a mesh in the call's arguments
        gate = Gate(None)
        gate.join(mesh)
    sink: Any = None
    if kind != "broadcast":
        sink = rt.loop.create_future() if home else concurrent.futures.Future()
    gate.submit(rt, home, _Item(redo, kind, sink))
    if timeout is not None and kind == "future":
        _expire(rt, home, sink, timeout, about)
    if kind == "broadcast":
        return None
    if kind == "stream":
        return LateStream(sink, len(mesh))
    if home:
        return Future(afut=sink, about=about, mesh=called)
    return Future(cfut=sink, about=about, mesh=called)


def _expire(rt: Runtime, home: bool, sink: Any, timeout: float, about: Any) -> None:
    """Fail ``sink`` with ``CallTimeoutError`` if nothing settled it within ``timeout``."""
    mesh, method = about if isinstance(about, tuple) else ("", "")

    def expire() -> None:
        if sink.done():
            return
        exc = CallTimeoutError(
            f"{method!r}: no result within {timeout}s (its mesh was not ready in time: "
            "the call waited and was never sent)",
            mesh=mesh or None,
        )
        try:
            sink.set_exception(exc)
        except (asyncio.InvalidStateError, concurrent.futures.InvalidStateError):
            pass  # settled meanwhile, from another thread

    if home:  # (the loop's thread: the timer goes once the call is settled)
        timer = rt.loop.call_later(timeout, expire)
        sink.add_done_callback(lambda _: timer.cancel())
    else:  # on the loop too, which also drains the queue: never both at once

        def arm(_rt: Runtime) -> None:
            _rt.loop.call_later(timeout, expire)

        _schedule(rt, arm)


class LateStream:
    """A stream whose request waits in a gate: iterating it waits for the real one."""

    def __init__(self, sink: asyncio.Future[Any] | concurrent.futures.Future[Any], n: int) -> None:
        self._sink = sink
        self._n = n  # how many replies come

    async def __aiter__(self) -> AsyncIterator[Any]:
        sink = self._sink
        inner = await (sink if isinstance(sink, asyncio.Future) else asyncio.wrap_future(sink))
        async for value in inner:
            yield value

    def __iter__(self) -> Iterator[Any]:
        sink = self._sink
        if isinstance(sink, asyncio.Future):  # in a loop: awaitables, as Stream's (replies.py)
            return (self._nth(i) for i in range(self._n))
        return iter(sink.result())

    async def _nth(self, i: int) -> Any:
        sink = self._sink
        inner = await (sink if isinstance(sink, asyncio.Future) else asyncio.wrap_future(sink))
        return await inner._nth(i)

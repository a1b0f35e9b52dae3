"""Generator endpoints, the caller's half: a stream of items, with flow control.

``ref.gen.call_one(...)`` on a generator endpoint returns an ``ItemStream``:
iterate it with ``async for`` (in the loop that made it) or plain ``for``
(in synchronous code). ``mesh.gen.call(...)`` streams from every rank at once
and yields ``(Point, item)`` pairs as they arrive.

Each rank's stream is one request (a ``StreamCall``) that stays in flight on
its proc connection until it ends, so everything that fails a call fails a
stream too, as fast: a rank that dies fails it with ``SupervisionError``, a
dropped connection with ``ConnectionLostError``. A source (``Source``) is the
request's sink: the runtime settles it like a future, and hands it the
stream's messages (``on_message``).

Flow control: the producer runs at most ``window`` items ahead. The consumer
grants credit back (``Credit``) each time it has read half a window, so the
producer rarely waits and at most ``window`` items of a rank are held here.
Breaking out of the loop (the stream is dropped), ``close()``/``aclose()``, or
an error from another rank cancels the rest (``Cancel``): the generators
close and their ``finally`` blocks run.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Generic, TypeVar

from zmesh._actor import Point
from zmesh._client.calls import runtime as _runtime
from zmesh._client.calls.connections import BIG, ProcConn
from zmesh._client.calls.grouping import member
from zmesh._client.calls.inflight import OneRequest
from zmesh._client.calls.runtime import ProcRef, Runtime
from zmesh._errors import CallTimeoutError, EncodeError
from zmesh._wire import messages as w
from zmesh._wire.codec import nbytes
from zmesh._wire.deadlines import CLOCK, budget

T = TypeVar("T")

ITEM, END, ERROR = 0, 1, 2
_NOTHING: Any = object()


class Inbox:
    """What the sources of one stream have delivered, in arrival order.

    Filled on the runtime's loop; read by the consumer: on the same loop
    (``async for`` in the loop that made the stream), or from a plain thread.
    It does not refer to the stream, so that a stream its consumer drops is
    collected (and cancelled) while its requests are still in flight.
    """

    __slots__ = ("q", "sq", "waiter")

    def __init__(self, home: bool) -> None:
        self.q: deque[tuple[int, int, Any]] | None = deque() if home else None
        self.sq: queue.SimpleQueue[tuple[int, int, Any]] | None = (
            None if home else queue.SimpleQueue()
        )
        self.waiter: asyncio.Future[None] | None = None

    def put(self, index: int, kind: int, value: Any) -> None:
        if self.q is None:
            assert self.sq is not None
            self.sq.put((index, kind, value))
            return
        self.q.append((index, kind, value))
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Source:
    """One rank's generator, as the runtime sees it: the sink of its request.

    Only ever touched on the runtime's loop.
    """

    __slots__ = ("conn", "ended", "id", "inbox", "index", "items", "launch", "rt")

    def __init__(self, rt: Runtime, inbox: Inbox, index: int) -> None:
        self.rt = rt
        self.inbox = inbox
        self.index = index
        self.conn: ProcConn | None = None
        self.id = 0
        self.ended = False
        self.items = 0  # delivered so far
        # How to start it (see ``open_stream``); a service's stream
        # (zmesh._service.streaming) starts its own, where it is routed.
        self.launch: Callable[[Source, ProcRef, str], None] | None = None

    # The future interface the runtime settles a request's sink with.

    def done(self) -> bool:
        return self.ended

    def set_result(self, value: Any) -> None:
        # A plain ``Reply``: the proc ran the endpoint as a function. Its
        # value is the stream's one item.
        if not self.ended:
            self.inbox.put(self.index, ITEM, value)
            self._end(END, None)

    def set_exception(self, exc: BaseException) -> None:
        if not self.ended:
            self._end(ERROR, exc)

    def on_message(self, conn: ProcConn, req: OneRequest, msg: Any, frames: list[Any]) -> None:
        """A stream message of this source's request (which the runtime popped)."""
        kind = type(msg)
        if kind is w.StreamItem:
            conn.pending[msg.id] = req  # the request stays in flight until the end
            req.size = 0  # its arguments have arrived
            try:
                payload = msg.payload
                value = payload.args[0] if payload.blob is None else (
                    self.rt.codec.unpack_value(payload, frames)
                )  # fmt: skip
            except Exception as exc:
                self.cancel()
                self._end(ERROR, EncodeError(f"cannot decode an item: {exc!r}", **conn.context()))
                return
            self.items += 1
            self.inbox.put(self.index, ITEM, value)
        elif kind is w.StreamEnd:
            self._end(END, None)
        else:  # StreamAlive: the producer checks that we are here
            conn.pending[msg.id] = req

    def _end(self, kind: int, value: Any) -> None:
        self.ended = True
        self.inbox.put(self.index, kind, value)

    # Called by the consumer, on the loop.

    def credit(self, n: int) -> None:
        c = self.conn
        if not self.ended and c is not None and c.sock is not None and c.broken is None:
            c.sock.send(self.rt.codec.encode(w.Credit(self.id, n)))

    def cancel(self) -> None:
        """Stop this source: the generator closes; nothing more is delivered."""
        if self.ended:
            return
        self.ended = True
        c = self.conn
        if c is None:
            return
        req = c.pending.pop(self.id, None)  # later items find no request: dropped
        if req is not None and req.size:
            c.bytes -= req.size
        # Still queued behind the in-flight limit: done() keeps it unsent, and
        # the proc ignores a cancel of a request it never sees.
        if c.sock is not None and c.broken is None:
            c.sock.send(self.rt.codec.encode(w.Cancel(self.id)))


class ItemStream(Generic[T]):
    """The items of a generator endpoint, in order, as they arrive.

    An async iterator (``async for``, in the event loop that made it) and a
    sync iterator (plain ``for``, in synchronous code). An exception the
    generator raised comes out of the iterator as ``ActorError`` after the
    items before it; a producer proc that dies ends it with
    ``SupervisionError``. One pass only: the items are not kept.

    ``close()`` / ``aclose()`` (or dropping the stream, e.g. by breaking out
    of the loop) closes the generator in the actor.
    """

    def __init__(
        self, rt: Runtime, home: bool, n: int, window: int, points: Any, timeout: float | None
    ) -> None:
        self._rt = rt
        self._home = home
        self._inbox = Inbox(home)
        self._sources = [Source(rt, self._inbox, i) for i in range(n)]
        self._points: list[Point] | None = points  # None: one rank, bare items
        self._open = n  # sources whose end has not been read yet
        self._done = n == 0
        self._unacked = [0] * n
        self._threshold = max(1, window // 2)
        self._timeout = timeout  # for each item the reader waits for
        self._context: dict[str, Any] = {}  # for errors: the rank, for one

    # ------------------------------------------------------------ reading

    def _take(self, entry: tuple[int, int, Any]) -> Any:
        i, kind, value = entry
        if kind == ITEM:
            left = self._unacked[i] + 1
            if left >= self._threshold:
                self._unacked[i] = 0
                self._credit(i, left)
            else:
                self._unacked[i] = left
            return value if self._points is None else (self._points[i], value)
        if kind == END:
            self._open -= 1
            return _NOTHING
        self._finish()  # one rank failed: the stream ends with its error
        raise value

    def _credit(self, i: int, n: int) -> None:
        src = self._sources[i]
        if self._home:
            src.credit(n)
        else:
            self._rt.loop.call_soon_threadsafe(src.credit, n)

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        q = self._inbox.q
        if q is None:  # made in plain code, read in an event loop
            return await asyncio.get_running_loop().run_in_executor(None, self._next_or_end)
        while True:
            if self._done:
                raise StopAsyncIteration
            if q:
                value = self._take(q.popleft())
                if value is not _NOTHING:
                    return value
                continue
            if self._open == 0:
                self._done = True
                raise StopAsyncIteration
            loop = self._rt.loop
            waiter = self._inbox.waiter = loop.create_future()
            timer = None if self._timeout is None else loop.call_later(
                self._timeout, _expire, waiter
            )  # fmt: skip
            try:
                late = await waiter
            finally:
                self._inbox.waiter = None
                if timer is not None:
                    timer.cancel()
            if late:
                raise self._timed_out()

    def _next_or_end(self) -> Any:
        try:
            return self.__next__()
        except StopIteration:
            raise StopAsyncIteration from None

    def __iter__(self) -> Iterator[T]:
        if self._inbox.sq is None:
            raise RuntimeError("a stream made inside an event loop is read with 'async for'")
        return self

    def __next__(self) -> T:
        sq = self._inbox.sq
        if sq is None:
            raise RuntimeError("a stream made inside an event loop is read with 'async for'")
        while True:
            if self._done:
                raise StopIteration
            if self._open == 0:
                self._done = True
                raise StopIteration
            try:
                entry = sq.get(timeout=self._timeout)
            except queue.Empty:
                raise self._timed_out() from None
            value = self._take(entry)
            if value is not _NOTHING:
                return value

    def _timed_out(self) -> CallTimeoutError:
        """No item within the timeout: the stream ends (its generators close)."""
        self._finish()
        return CallTimeoutError(f"no item within {self._timeout}s", **self._context)

    # ------------------------------------------------------------ closing

    def close(self) -> None:
        """Stop reading: every generator still running closes (its ``finally`` runs)."""
        self._finish()

    async def aclose(self) -> None:
        """``close()``, for ``contextlib.aclosing`` and async code."""
        self._finish()

    def _finish(self) -> None:
        if self._done and self._open == 0:
            return
        self._done = True
        self._open = 0
        if self._home:
            for src in self._sources:
                src.cancel()
            return
        try:
            for src in self._sources:
                self._rt.loop.call_soon_threadsafe(src.cancel)
        except RuntimeError:  # the loop is closed: nothing runs anymore
            pass

    def __del__(self) -> None:
        if not self._done or self._open:
            try:
                if self._home and not self._rt.loop.is_closed():
                    # Maybe not on the loop's thread (the collector runs anywhere).
                    self._home = False
                self._finish()
            except Exception:  # never raise from a finalizer
                pass

    def __repr__(self) -> str:
        return f"<zmesh.ItemStream of {len(self._sources)} rank(s)>"


def open_stream(
    refs: list[ProcRef],
    actor: str,
    method: str,
    payload: w.Payload,
    buffers: list[Any],
    *,
    window: int,
    timeout: float | None,
    block: bool,
    points: list[Point] | None,
) -> ItemStream[Any]:
    """Start ``method``'s generator on every proc of ``refs``; the stream of its items.

    ``points`` (one per ref) makes the items ``(point, item)`` pairs. (A
    service's generator endpoint streams through ``one_source_stream``
    instead: its dispatcher picks the replica, and moves the request if that
    replica dies before the first item.)
    """
    rt, home = _runtime.current()
    stream: ItemStream[Any] = ItemStream(rt, home, len(refs), window, points, timeout)
    if len(refs) == 1:
        r = refs[0]
        stream._context = {"mesh": r.mesh, "rank": r.rank, "host": r.host,
                           "log_path": r.log_path or None}  # fmt: skip
    elif refs:
        stream._context = {"mesh": refs[0].mesh}
    deadline = time.monotonic() + timeout if timeout is not None else 0.0
    sources = stream._sources

    def launch(src: Source, ref: ProcRef, actor: str) -> None:
        send_stream_call(rt, src, ref, actor, method, payload, buffers, deadline, window, block)

    for src in sources:
        src.launch = launch
    rt.dispatch(_start, sources, refs, actor, here=home, targets=[r.addr for r in refs])
    return stream


def _start(sources: list[Source], refs: list[ProcRef], actor: str) -> None:
    """Send one ``StreamCall`` per rank (on the runtime's loop)."""
    for src, ref in zip(sources, refs, strict=True):
        if not src.ended and src.launch is not None:  # (closed before it started)
            src.launch(src, ref, member(actor, ref))  # (one of several actors of a proc: by name)


def one_source_stream(
    rt: Runtime,
    home: bool,
    window: int,
    timeout: float | None,
    make: Callable[[Inbox], Source],
    context: dict[str, Any],
) -> tuple[ItemStream[Any], Source]:
    """A stream of one source that ``make(inbox)`` builds (a service's routed stream).

    Nothing is sent: the caller starts the source (``send_stream_call``) when
    it knows where. ``context`` goes on its errors (e.g. ``{"mesh": name}``).
    """
    stream: ItemStream[Any] = ItemStream(rt, home, 0, window, None, timeout)
    src = make(stream._inbox)
    stream._sources = [src]
    stream._unacked = [0]
    stream._open = 1
    stream._done = False
    stream._context = context
    return stream, src


def send_stream_call(
    rt: Runtime,
    src: Source,
    ref: ProcRef,
    actor: str,
    method: str,
    payload: w.Payload,
    buffers: list[Any],
    deadline: float,
    window: int,
    block: bool,
) -> None:
    """Send the ``StreamCall`` of ``src`` to ``ref``'s proc (on the runtime's loop)."""
    try:
        c = src.conn = rt.conn(ref)
        if c.broken is not None:
            src.set_exception(c.broken)
            return
        src.id = req_id = rt.next_id()
        msg = w.StreamCall(
            req_id,
            actor,
            method,
            payload,
            budget(deadline),
            window=window,
            sent=time.monotonic(),
            clock=CLOCK,
        )
        frames = rt.codec.encode(msg, buffers)
        size = sum(nbytes(f) for f in frames) if buffers or len(frames[0]) >= BIG else 0
        rt.post(c, frames, OneRequest(req_id, c, src, size), block)  # type: ignore[arg-type]
    except EncodeError as exc:
        ctx = src.conn.context() if src.conn is not None else {}
        src.set_exception(
            EncodeError(f"arguments of {method!r} cannot be sent: {exc.message}", **ctx)
        )
    except Exception as exc:  # a runtime that is closing: the stream says so
        src.set_exception(exc)


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_result(True)  # late: ``Inbox.put`` sets None

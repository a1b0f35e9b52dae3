"""The client runtime: one event loop's sockets to procs, and which runtime a caller uses.

A runtime belongs to one asyncio loop and owns every socket it uses (zmq
sockets are not thread-safe). Inside ``async`` code, the runtime lives on the
caller's own loop, so a call is one non-blocking send with no thread hop.
From plain synchronous code, calls go to a runtime on a background loop
thread ("zmesh-io") and the caller blocks on ``Future.get()``.

This module sends calls and handles replies (the hot path). Its neighbours
hold the rest: ``zmesh._client.calls.connections`` the connections to procs (one
per address), their in-flight limits and wait queues, and what happens when
one drops or supervision breaks it; ``zmesh._client.calls.inflight`` the requests
in flight and their fates (a reply, a failure, a timeout).

Requests in flight are kept per proc connection, so when supervision says a
rank failed, exactly the requests sent to it fail, at once, with
``SupervisionError``; later calls to that rank fail before sending. A mesh
that is over (stopped, or every rank terminal) is released by the
controller: its connections close and only a small tombstone remains.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
import zmq

from zmesh._client.calls import cancels as _cancels
from zmesh._client.calls import grouping as _grouping
from zmesh._client.calls.connections import (
    BIG,
    MAX_IN_FLIGHT,
    Connections,
    ProcConn,
    drain,
    expire,
    expire_one,
    frames_size,
    over,
    wait,
)
from zmesh._client.calls.future import Future
from zmesh._client.calls.inflight import (
    CallSpec,
    OneRequest,
    Request,
    Sink,
    outcome,
    resolve,
    settle,
)
from zmesh._client.control.controller import Controller
from zmesh._errors import EncodeError
from zmesh._shared.aio import running_loop
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec
from zmesh._wire.deadlines import CLOCK, budget

if TYPE_CHECKING:
    from collections.abc import Iterable

    from zmesh._client.calls.lanes import Lane
    from zmesh._client.calls.transport import Deliver
    from zmesh._client.calls.tree import Tree
    from zmesh._client.control.controller import Controller


class ProcRef(msgspec.Struct, frozen=True):
    """Where one rank of a proc mesh lives. Part of every handle, so it travels."""

    mesh: str
    rank: int
    generation: int
    addr: str
    agent: str  # the agent's control address
    host: str  # the agent's label
    log_path: str = ""
    # One of several actors in the proc (``zmesh._client.calls.grouping``): its
    # local index there, and its rank in its actor mesh. -1: the proc's one actor.
    index: int = -1
    point: int = -1


class Runtime(Connections):
    """The zmesh client on one event loop. Get it with ``current()``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.ctx: zmq.Context[Any] = zmq.Context.instance()
        self.codec = Codec(w.CLIENT_INBOX)
        self._ids = itertools.count(1)
        self.conns: dict[str, ProcConn] = {}
        # Supervision tells the data path what it decides through callbacks:
        # the controller knows nothing of the runtime.
        self.controller: Controller = Controller(loop, self.ctx, self.break_conn, self.release)
        self.closed = False
        self.closers: list[Callable[[], None]] = []  # more sockets to close (ports)
        # Threads' own lanes (zmesh._client.calls.lanes) with sockets open, held
        # weakly (a lane goes with its thread): supervision fails their calls
        # to a proc with the connection's calls.
        self.sync_lock = threading.Lock()
        self.lanes: weakref.WeakSet[Lane] = weakref.WeakSet()
        # Tree fan-out (zmesh._client.calls.tree), made on first use; ``held``: the
        # proc addresses whose direct messages must wait for it (usually none).
        self.tree: Tree | None = None
        self.held: dict[str, int] = {}

    def dispatch(
        self,
        fn: Callable[..., Any],
        *args: Any,
        here: bool | None = None,
        targets: Iterable[str] | None = None,
    ) -> None:
        """Run ``fn(*args)`` on this runtime's loop, which owns every socket.

        Called on the loop, it runs at once. From another thread it is
        scheduled with ``call_soon_threadsafe``: callbacks run in the order
        they were scheduled, so what one thread sends (calls, broadcasts,
        streams) goes out in the order the thread made it.

        A thread that also calls procs on its own lane (``zmesh._client.calls.lanes``)
        first waits for those calls' replies, so that this cannot overtake them.

        Args:
            here: whether the caller is on the loop, if it knows already
                (``current()`` says); else it is looked up.
            targets: the addresses of the procs ``fn`` sends to (``None``:
                unknown, any; ``()``: none).
        """
        if here is None:
            here = running_loop() is self.loop
        if here:
            fn(*args)
        else:
            lane: Lane | None = getattr(thread_lanes, "lane", None)
            if targets != () and lane is not None and lane.rt is self:
                lane.before_io(targets)
            self.loop.call_soon_threadsafe(fn, *args)

    # ------------------------------------------------------------ requests

    def call(self, ref: ProcRef, spec: CallSpec, fut: Sink) -> None:
        """Send one ``Call`` (``spec``) to ``ref``'s proc; its answer settles ``fut``.

        The single-target fast path of ``send``: no closures, and the reply
        is one dict pop away from its future.

        Raises:
            EncodeError: a part of the message is over the size limit.
        """
        if self.held and ref.addr in self.held:  # an earlier tree fan-out is not forwarded yet
            if self.tree.defer([ref.addr], functools.partial(self.call, ref, spec, fut), fut):  # type: ignore[union-attr]
                return
        c = self.conns.get(ref.addr)
        if c is None or c.mesh != ref.mesh:
            c = self.conn(ref)
        if c.broken is not None:
            resolve(fut, False, c.broken)
            return
        req_id = next(self._ids)
        actor, buffers, deadline, timeout = spec.actor, spec.buffers, spec.deadline, spec.timeout
        try:
            left = budget(deadline) if deadline else 0.0  # a budget (zmesh._wire.deadlines)
            call = w.Call(
                req_id, actor, spec.method, spec.payload, left, sent=time.monotonic(), clock=CLOCK
            )
            frames = self.codec.encode(call, buffers)
        except EncodeError as exc:
            raise EncodeError(
                f"arguments of {spec.method!r} cannot be sent: {exc.message}", **c.context()
            ) from exc
        size = frames_size(frames) if buffers or len(frames[0]) >= BIG else 0
        req = OneRequest(req_id, c, fut, size, actor)
        if timeout is not None:
            req.timer = self.loop.call_later(timeout, expire_one, req, timeout)
        waiter = fut.fut if type(fut) is _grouping.ActorSink else fut  # (one actor of several)
        if isinstance(waiter, asyncio.Future):  # cancelling it reaches the proc
            waiter.add_done_callback(functools.partial(_cancels.on_done, self.codec, req))
        if c.waiting or len(c.pending) >= MAX_IN_FLIGHT or (size and over(c, size)):
            wait(c, frames, req, 0, spec.block)
            return
        c.sock.send(frames)  # type: ignore[union-attr]  # not broken: it has a socket
        c.pending[req_id] = req
        if size:
            c.bytes += size

    def submit(self, ref: ProcRef, spec: CallSpec) -> Future[Any]:
        """The transport's ``submit`` on this runtime's loop (``zmesh._client.calls.transport``):
        ``call`` with an asyncio future, whose cancel reaches the proc.

        ``spec`` is addressed already (to ``name#k`` for one actor of a group).
        """
        fut: asyncio.Future[Any] = self.loop.create_future()
        sink: Any = fut if ref.index < 0 else _grouping.ActorSink(fut, ref)
        self.call(ref, spec, sink)
        return Future(afut=fut, about=(ref, spec.method))

    def fan_out(self, refs: list[ProcRef], spec: CallSpec, deliver: Deliver | None) -> None:
        """The transport's ``fan_out``: ``send`` of ``spec``'s ``Call``, on this runtime's loop."""
        msg = spec.message_for(oneway=deliver is None)
        self.send(refs, msg, spec.buffers, deliver, spec.timeout, spec.block)

    def withdraw_threadsafe(self, sink: Any, addr: str) -> None:
        """Cancel the call to ``addr`` whose answer goes to ``sink``, from any thread."""
        self.loop.call_soon_threadsafe(self._withdraw, sink, addr)

    def _withdraw(self, sink: Any, addr: str) -> None:
        c = self.conns.get(addr)
        _cancels.cancel_sink(self.codec, [c] if c is not None else [], sink)

    def next_id(self) -> int:
        """A fresh request id of this runtime."""
        return next(self._ids)

    def post(self, c: ProcConn, frames: list[Any], req: OneRequest, block: bool = True) -> None:
        """Send ``req`` (encoded as ``frames``) on ``c``, or queue it behind the
        in-flight limits as ``call`` does; ``c`` is not broken."""
        if self.held and c.ref.addr in self.held:  # see call()
            again = functools.partial(self.post, c, frames, req, block)
            if self.tree.defer([c.ref.addr], again, req.fut):  # type: ignore[union-attr]
                return
        if c.waiting or len(c.pending) >= MAX_IN_FLIGHT or (req.size and over(c, req.size)):
            wait(c, frames, req, 0, block)
            return
        c.sock.send(frames)  # type: ignore[union-attr]  # not broken: it has a socket
        c.pending[req.id] = req
        if req.size:
            c.bytes += req.size

    def call_threadsafe(
        self, ref: ProcRef, spec: CallSpec, fut: concurrent.futures.Future[Any]
    ) -> None:
        """``call`` for a caller in another thread (scheduled with ``call_soon_threadsafe``)."""
        if not fut.set_running_or_notify_cancel():
            return  # cancelled before it was sent
        try:
            self.call(ref, spec, fut)
        except BaseException as exc:
            resolve(fut, False, exc)

    def send(
        self,
        refs: list[ProcRef],
        msg_for: Callable[[int], Any],
        buffers: list[Any],
        deliver: Callable[[int, bool, Any], None] | None,
        timeout: float | None = None,
        block: bool = True,
    ) -> int:
        """Send one message to every proc in ``refs``; answers go to ``deliver``.

        The message is encoded once, whatever the fan-out. A target already
        known to be broken gets its error delivered at once, without a send.
        A message that cannot be encoded is delivered as an ``EncodeError``
        to every target (raised, for a oneway). Targets that are several
        actors of one proc get one message per proc (``zmesh._client.calls.grouping``).
        """
        held = self.held
        if held and any(r.addr in held for r in refs):  # see call()
            again = functools.partial(self.send, refs, msg_for, buffers, deliver, timeout, block)
            if self.tree.defer([r.addr for r in refs], again):  # type: ignore[union-attr]
                return 0
        if refs and refs[0].index >= 0:
            return _grouping.send(self, refs, msg_for, buffers, deliver, timeout, block)
        req_id = next(self._ids)
        conns = [self.conn(r) for r in refs]
        req = Request(req_id, conns, deliver) if deliver is not None else None
        try:
            frames = self.codec.encode(msg_for(req_id), buffers)
        except EncodeError as exc:
            ctx = conns[0].context() if len(conns) == 1 else {"mesh": refs[0].mesh}
            err = EncodeError(f"the message cannot be sent: {exc.message}", **ctx)
            if req is None:
                raise err from exc
            err.__cause__ = exc
            for i in range(len(conns)):
                settle(req, i, False, err)
            return req_id
        size = frames_size(frames) if buffers or len(frames[0]) >= BIG else 0
        if req is not None:
            req.size = size
            if timeout is not None:
                req.timer = self.loop.call_later(timeout, expire, req, timeout)
        for i, c in enumerate(conns):
            if c.broken is not None:
                if req is not None:
                    settle(req, i, False, c.broken)
                continue
            if c.waiting or (
                req is not None and (len(c.pending) >= MAX_IN_FLIGHT or (size and over(c, size)))
            ):
                wait(c, frames, req, i, block)
                continue
            c.sock.send(frames)  # type: ignore[union-attr]  # not broken: it has a socket
            if req is not None:
                c.pending[req_id] = req
                c.bytes += size
        return req_id

    def _on_reply(self, conn: ProcConn, frames: list[Any]) -> int | None:
        try:
            msgs = self.codec.decode_frames(frames)
        except Exception:  # a garbled reply is dropped; its calls time out or fail
            return None
        for msg in msgs:
            self._on_reply_msg(conn, msg, frames)
        if conn.waiting and conn.broken is None:  # (broken: its last answers, read as it fails)
            drain(conn)
        return len(msgs)

    def _on_reply_msg(self, conn: ProcConn, msg: Any, frames: list[Any]) -> None:
        req = conn.pending.pop(msg.id, None)
        if req is None:  # late answer to a request that already ended
            if conn.abandoned:  # its actor is done with it now
                conn.abandoned.pop(msg.id, None)
            return
        if req.size:
            conn.bytes -= req.size
        if type(msg) is not w.Reply and type(msg) is not w.Failure:
            if type(msg) is w.Gathered or type(msg) is w.GatheredFrames:
                # Several actors' answers: zmesh._client.calls.grouping reads them.
                ok, value = True, _grouping.Parts(msg, frames)
            else:
                # An item of a stream: its request is a stream source (zmesh._client.ports.streams).
                req.fut.on_message(conn, req, msg, frames)  # type: ignore[union-attr]
                return
        else:
            ok, value = outcome(self.codec, msg, frames, conn.ref)
        if isinstance(req, OneRequest):
            if req.timer is not None:
                req.timer.cancel()
            resolve(req.fut, ok, value)
        else:
            index = req.conns.index(conn) if len(req.conns) > 1 else 0
            settle(req, index, ok, value)

    def close(self) -> None:
        """Close every socket (the loop is stopping or gone)."""
        if self.closed:
            return
        self.closed = True
        self.controller.close()
        for close in self.closers:
            close()
        for c in self.conns.values():
            if c.sock is not None:
                c.sock.close()
        self.conns.clear()


# Each thread's own lane (``thread_lanes.lane``), set by zmesh._client.calls.lanes.
# ``Runtime.dispatch`` tells it before the thread sends on the I/O path, so
# that what the thread sent on its lane goes out first.
thread_lanes = threading.local()


# ---------------------------------------------------------- which runtime

_lock = threading.Lock()
_runtimes: dict[asyncio.AbstractEventLoop, Runtime] = {}
_home: asyncio.AbstractEventLoop | None = None  # where threads without a loop send work
_io_thread: threading.Thread | None = None


def home_loop() -> asyncio.AbstractEventLoop | None:
    """The loop of the runtime threads without a loop send work to, if it runs yet."""
    return _home


def live_runtimes() -> list[Runtime]:
    """This process's runtimes whose loops run (one that does not hears nothing)."""
    with _lock:
        return [rt for rt in _runtimes.values() if not rt.closed and rt.loop.is_running()]


def set_home_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Make ``loop`` the runtime for threads that have no loop (used by procs)."""
    global _home
    _home = loop


def current() -> tuple[Runtime, bool]:
    """The runtime for the caller, and whether the caller is on its loop."""
    loop = running_loop()
    if loop is None:
        return _runtime_for(_home_loop()), False
    rt = _runtimes.get(loop)
    return (rt if rt is not None else _runtime_for(loop)), True


def home() -> Runtime:
    """The runtime of this process's I/O loop (a proc's own loop, in a proc).

    Parts that must outlive the caller's event loop run there: a service's
    orchestrator lives as long as its process, like a mesh.
    """
    return _runtime_for(_home_loop())


def _runtime_for(loop: asyncio.AbstractEventLoop) -> Runtime:
    rt = _runtimes.get(loop)
    if rt is None:
        with _lock:
            rt = _runtimes.get(loop)
            if rt is None:
                for old_loop, old in list(_runtimes.items()):
                    if old_loop.is_closed():  # asyncio.run() ended: its sockets go too
                        old.close()
                        del _runtimes[old_loop]
                rt = _runtimes[loop] = Runtime(loop)
    return rt


def _home_loop() -> asyncio.AbstractEventLoop:
    global _home, _io_thread
    loop = _home
    if loop is not None and not loop.is_closed():  # the usual case: no lock
        return loop
    with _lock:
        if _home is None or _home.is_closed():
            loop = asyncio.new_event_loop()
            _io_thread = threading.Thread(target=loop.run_forever, name="zmesh-io", daemon=True)
            _io_thread.start()
            _home = loop
        return _home


def shutdown_io_thread() -> None:
    """Stop the background loop (at exit), closing its runtime's sockets."""
    global _home
    loop = _home
    if loop is None or _io_thread is None or loop.is_closed():
        return
    rt = _runtimes.pop(loop, None)

    async def close_all() -> None:
        if rt is not None:
            rt.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    try:
        asyncio.run_coroutine_threadsafe(close_all(), loop).result(2.0)
    except Exception:  # closing is best effort; the thread is a daemon
        pass
    try:
        loop.call_soon_threadsafe(loop.stop)
        _io_thread.join(timeout=2.0)
    except RuntimeError:
        pass
    if not _io_thread.is_alive():
        loop.close()
    _home = None


def close_finished() -> None:
    """Close the runtimes of loops that are not running (``asyncio.run`` returned).

    A loop that is not running has no callback in flight, so its sockets can
    be closed from here; it gets a fresh runtime if it runs zmesh again.
    """
    with _lock:
        for loop, rt in list(_runtimes.items()):
            if loop.is_closed() or not loop.is_running():
                rt.close()
                del _runtimes[loop]

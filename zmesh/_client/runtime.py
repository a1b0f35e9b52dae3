"""The client runtime: sockets to procs, requests in flight, and their fates.

A runtime belongs to one asyncio loop and owns every socket it uses (zmq
sockets are not thread-safe). Inside ``async`` code, the runtime lives on the
caller's own loop, so a call is one non-blocking send with no thread hop.
From plain synchronous code, calls go to a runtime on a background loop
thread ("zmesh-io") and the caller blocks on ``Future.get()``.

Requests in flight are kept per proc connection, so when supervision says a
rank failed, exactly the requests sent to it fail, at once, with
``SupervisionError``; later calls to that rank fail before sending.

Backpressure: at most ``MAX_IN_FLIGHT`` calls (and ``MAX_IN_FLIGHT_BYTES`` of
large messages) are sent and unanswered on one connection. Later calls wait
in the connection's ``waiting`` queue, in send order, and go out as replies
come back; with ``block=False`` they fail with ``OverloadedError`` instead.
So no ZeroMQ pipe ever nears its high-water mark: a full pipe stops libzmq
reading the connection, and a reconnect then trips libzmq's
``_input_stopped`` assertion (libzmq issues 3937, 4767).

A connection that drops (a socket monitor reports it) takes the calls that
were on it: they fail with ``ConnectionLostError`` unless supervision
explains the drop first (a crash), and the socket is replaced, so nothing it
still queued can run after its call has failed. A mesh that is over
(stopped, or every rank terminal) is released by the controller: its
connections close and only a small tombstone remains.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import os
import pickle
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import msgspec
import zmq

from zmesh._client.controller import AGENT_TIMEOUT
from zmesh._errors import (
    ActorError,
    ActorStoppedError,
    CallTimeoutError,
    ConnectionLostError,
    EncodeError,
    EndpointError,
    OverloadedError,
    SpawnError,
    SupervisionError,
    ZmeshError,
)
from zmesh._wire import messages as w
from zmesh._wire.codec import BIG_BUFFER, Codec, nbytes
from zmesh._wire.security import secure_client
from zmesh._wire.zsock import AsyncSocket, configure

if TYPE_CHECKING:
    from collections.abc import Iterable

    from zmesh._client.controller import Controller
    from zmesh._client.lanes import SyncCall


class ProcRef(msgspec.Struct, frozen=True):
    """Where one rank of a proc mesh lives. Part of every handle, so it travels."""

    mesh: str
    rank: int
    generation: int
    addr: str
    agent: str  # the agent's control address
    host: str  # the agent's label
    log_path: str = ""


# Calls sent on one proc connection and not answered yet, at most: a tenth
# of the sockets' high-water mark (zmesh._wire.zsock.HWM), so no pipe fills.
MAX_IN_FLIGHT = int(os.environ.get("ZMESH_MAX_IN_FLIGHT", "10000"))
# Bytes of large messages (BIG and over) in flight on one connection, at
# most; a message larger than this still goes, alone.
MAX_IN_FLIGHT_BYTES = int(os.environ.get("ZMESH_MAX_IN_FLIGHT_BYTES", str(1 << 30)))
BIG = BIG_BUFFER
# After a connection drops, how long its calls wait for supervision to say
# why before they fail with ConnectionLostError: a crash is reported by the
# agent at once, a lost host once its agent is silent for AGENT_TIMEOUT.
DISCONNECT_GRACE = AGENT_TIMEOUT + 0.5


class ProcConn:
    """This runtime's DEALER to one proc, and the requests in flight on it."""

    __slots__ = ("broken", "bytes", "mesh", "pending", "ref", "sock", "waiting")

    def __init__(self, ref: ProcRef, sock: AsyncSocket | None) -> None:
        self.ref = ref
        self.mesh = ref.mesh
        self.sock = sock  # None while broken, and for a released mesh
        # Sent on this connection and not answered, by request id, in send
        # order. A reply arrives on its connection, so settling it is one pop.
        self.pending: dict[int, Request | OneRequest] = {}
        # Not sent yet (over the in-flight limit), in send order:
        # (frames, request or None for a oneway, index of this conn in it).
        self.waiting: deque[tuple[list[Any], Request | OneRequest | None, int]] = deque()
        self.bytes = 0  # of large messages in ``pending``
        self.broken: ZmeshError | None = None  # set: calls fail before sending

    @property
    def inflight(self) -> int:
        """Requests on this connection not answered yet (sent or waiting)."""
        return len(self.pending) + len(self.waiting)

    def context(self) -> dict[str, Any]:
        """The error context of this connection's proc."""
        r = self.ref
        return {"mesh": r.mesh, "rank": r.rank, "host": r.host, "log_path": r.log_path or None}


# Where the answer of a single-target call goes: an asyncio future on the
# runtime's loop, or a concurrent future for a caller blocked in ``.get()``.
# Both are only ever settled from the runtime's loop; a concurrent future is
# marked running before its call is sent, so its caller cannot cancel it.
Sink: TypeAlias = asyncio.Future[Any] | concurrent.futures.Future[Any]


class OneRequest:
    """A call to one proc whose answer settles ``fut`` directly (the fast path).

    While it waits to be sent, a done ``fut`` (timed out, cancelled) means it
    is not sent at all.
    """

    __slots__ = ("conn", "fut", "id", "size", "timer")

    def __init__(self, req_id: int, conn: ProcConn, fut: Sink, size: int) -> None:
        self.id = req_id
        self.conn = conn
        self.fut = fut
        self.size = size  # bytes, for a large message; else 0
        self.timer: asyncio.TimerHandle | None = None


class Request:
    """One message sent to one or more procs, collecting their answers.

    ``deliver(index, ok, value)`` is called once per target: ``ok`` with the
    value, or not ok with the exception.
    """

    __slots__ = ("conns", "deliver", "id", "open", "queued", "size", "timer")

    def __init__(
        self, req_id: int, conns: list[ProcConn], deliver: Callable[[int, bool, Any], None]
    ) -> None:
        self.id = req_id
        self.conns = conns
        self.deliver = deliver
        self.open = len(conns)
        self.size = 0  # bytes, for a large message; else 0
        # Indexes of the conns where it waits to be sent (None: nowhere yet).
        self.queued: set[int] | None = None
        self.timer: asyncio.TimerHandle | None = None


def resolve(fut: Sink, ok: bool, value: Any) -> None:
    """Settle ``fut`` with a value (``ok``) or an exception, unless it is done."""
    if fut.done():  # an asyncio future its caller cancelled
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


class Runtime:
    """The zmesh client on one event loop. Get it with ``current()``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        from zmesh._client.controller import Controller

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
        # Calls in flight on threads' own lanes (zmesh._client.lanes), by proc
        # address: supervision fails them with the connection's calls.
        self.sync_lock = threading.Lock()
        self.sync_calls: dict[str, set[SyncCall]] = {}

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

        A thread that also calls procs on its own lane (``zmesh._client.lanes``)
        first waits for those calls' replies, so that this cannot overtake them.

        Args:
            here: whether the caller is on the loop, if it knows already
                (``current()`` says); else it is looked up.
            targets: the addresses of the procs ``fn`` sends to (``None``:
                unknown, any; ``()``: none).
        """
        if here is None:
            here = asyncio._get_running_loop() is self.loop
        if here:
            fn(*args)
        else:
            if targets != () and before_io is not None:
                before_io(self, targets)
            self.loop.call_soon_threadsafe(fn, *args)

    # ------------------------------------------------------------ connections

    def conn(self, ref: ProcRef) -> ProcConn:
        """The connection to ``ref``'s proc, made on first use.

        For a mesh the controller has released (stopped or failed), a
        connection with no socket whose calls fail at once.
        """
        c = self.conns.get(ref.addr)
        if c is not None and c.mesh == ref.mesh:
            return c
        gone = self.controller.gone(ref)
        if gone is not None:
            dead = ProcConn(ref, None)
            dead.broken = gone
            return dead
        if c is not None:
            # The address (a reused port) serves another mesh now: one of the
            # two procs is gone. The controller's view says which.
            if c.broken is None and not self.controller.live_at(ref):
                dead = ProcConn(ref, None)
                dead.broken = _reused(dead, c.mesh)
                return dead
            self._drop(c, c.broken or _reused(c, ref.mesh))
        c = ProcConn(ref, None)
        c.sock = self._socket(c)
        self.conns[ref.addr] = c
        self.controller.watch(ref)
        return c

    def _socket(self, c: ProcConn) -> AsyncSocket:
        sock = secure_client(configure(self.ctx.socket(zmq.DEALER), data=True), addr=c.ref.addr)
        sock.connect(c.ref.addr)
        a = AsyncSocket(sock, self.loop, None, batch=True)
        a.on_message = functools.partial(self._on_reply, c)
        a.watch_disconnects(functools.partial(self._on_disconnect, c, a))
        return a

    def release(self, mesh: str, error: ZmeshError) -> None:
        """Close the connections to ``mesh``'s procs (it is over); what is
        still on them fails with ``error``."""
        for c in [c for c in self.conns.values() if c.mesh == mesh]:
            self._drop(c, error)

    def _drop(self, c: ProcConn, error: ZmeshError) -> None:
        if self.conns.get(c.ref.addr) is c:
            del self.conns[c.ref.addr]
        c.broken = error
        self._fail_all(c, error)
        if c.sock is not None:
            c.sock.close()
            c.sock = None

    # ------------------------------------------------------------ requests

    def call(
        self,
        ref: ProcRef,
        actor: str,
        method: str,
        payload: w.Payload,
        buffers: list[Any],
        deadline: float,
        fut: Sink,
        timeout: float | None = None,
        block: bool = True,
    ) -> None:
        """Send one ``Call`` to ``ref``'s proc; its answer settles ``fut``.

        The single-target fast path of ``send``: no closures, and the reply
        is one dict pop away from its future.

        Raises:
            EncodeError: a part of the message is over the size limit.
        """
        c = self.conns.get(ref.addr)
        if c is None or c.mesh != ref.mesh:
            c = self.conn(ref)
        if c.broken is not None:
            resolve(fut, False, c.broken)
            return
        req_id = next(self._ids)
        try:
            frames = self.codec.encode(w.Call(req_id, actor, method, payload, deadline), buffers)
        except EncodeError as exc:
            raise EncodeError(
                f"arguments of {method!r} cannot be sent: {exc.message}", **c.context()
            ) from exc
        size = _size(frames) if buffers or len(frames[0]) >= BIG else 0
        req = OneRequest(req_id, c, fut, size)
        if timeout is not None:
            req.timer = self.loop.call_later(timeout, self._expire_one, req, timeout)
        if c.waiting or len(c.pending) >= MAX_IN_FLIGHT or (size and _over(c, size)):
            self._wait(c, frames, req, 0, block)
            return
        c.sock.send(frames)  # type: ignore[union-attr]  # not broken: it has a socket
        c.pending[req_id] = req
        if size:
            c.bytes += size

    def next_id(self) -> int:
        """A fresh request id of this runtime."""
        return next(self._ids)

    def post(self, c: ProcConn, frames: list[Any], req: OneRequest, block: bool = True) -> None:
        """Send ``req`` (encoded as ``frames``) on ``c``, or queue it behind the
        in-flight limits as ``call`` does; ``c`` is not broken."""
        if c.waiting or len(c.pending) >= MAX_IN_FLIGHT or (req.size and _over(c, req.size)):
            self._wait(c, frames, req, 0, block)
            return
        c.sock.send(frames)  # type: ignore[union-attr]  # not broken: it has a socket
        c.pending[req.id] = req
        if req.size:
            c.bytes += req.size

    def call_threadsafe(
        self,
        ref: ProcRef,
        actor: str,
        method: str,
        payload: w.Payload,
        buffers: list[Any],
        deadline: float,
        fut: concurrent.futures.Future[Any],
        timeout: float | None = None,
        block: bool = True,
    ) -> None:
        """``call`` for a caller in another thread (scheduled with ``call_soon_threadsafe``)."""
        if not fut.set_running_or_notify_cancel():
            return  # cancelled before it was sent
        try:
            self.call(ref, actor, method, payload, buffers, deadline, fut, timeout, block)
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
        to every target (raised, for a oneway).
        """
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
                self._settle(req, i, False, err)
            return req_id
        size = _size(frames) if buffers or len(frames[0]) >= BIG else 0
        if req is not None:
            req.size = size
            if timeout is not None:
                req.timer = self.loop.call_later(timeout, self._expire, req, timeout)
        for i, c in enumerate(conns):
            if c.broken is not None:
                if req is not None:
                    self._settle(req, i, False, c.broken)
                continue
            if c.waiting or (
                req is not None and (len(c.pending) >= MAX_IN_FLIGHT or (size and _over(c, size)))
            ):
                self._wait(c, frames, req, i, block)
                continue
            c.sock.send(frames)  # type: ignore[union-attr]  # not broken: it has a socket
            if req is not None:
                c.pending[req_id] = req
                c.bytes += size
        return req_id

    def _wait(
        self, c: ProcConn, frames: list[Any], req: Request | OneRequest | None, i: int, block: bool
    ) -> None:
        """Queue a message behind the in-flight limit (or fail it: ``block=False``)."""
        if req is not None and not block:
            err = OverloadedError(
                f"{len(c.pending)} calls from this caller are in flight to this proc "
                f"(limit {MAX_IN_FLIGHT} calls, {MAX_IN_FLIGHT_BYTES:,} bytes of large "
                "messages); the call was not sent",
                **c.context(),
            )  # fmt: skip
            self._fail(req, i, err)
            return
        if isinstance(req, Request):
            if req.queued is None:
                req.queued = set()
            req.queued.add(i)
        c.waiting.append((frames, req, i))

    def _drain(self, c: ProcConn) -> None:
        """Send what waits on ``c``, in order, while the limits allow."""
        waiting, pending = c.waiting, c.pending
        while waiting and c.sock is not None:
            frames, req, i = waiting[0]
            if req is not None:
                if isinstance(req, OneRequest):
                    if req.fut.done():  # timed out or cancelled while waiting
                        waiting.popleft()
                        continue
                elif req.queued is None or i not in req.queued:  # ended while waiting
                    waiting.popleft()
                    continue
                if len(pending) >= MAX_IN_FLIGHT or (req.size and _over(c, req.size)):
                    return
            waiting.popleft()
            c.sock.send(frames)
            if req is not None:
                if isinstance(req, Request):
                    req.queued.discard(i)  # type: ignore[union-attr]
                pending[req.id] = req
                c.bytes += req.size

    def _on_reply(self, conn: ProcConn, frames: list[Any]) -> int | None:
        try:
            msgs = self.codec.decode_frames(frames)
        except Exception:  # a garbled reply is dropped; its calls time out or fail
            return None
        for msg in msgs:
            self._on_reply_msg(conn, msg, frames)
        if conn.waiting:
            self._drain(conn)
        return len(msgs)

    def _on_reply_msg(self, conn: ProcConn, msg: Any, frames: list[Any]) -> None:
        req = conn.pending.pop(msg.id, None)
        if req is None:
            return  # late answer to a request that already ended
        if req.size:
            conn.bytes -= req.size
        if type(msg) is not w.Reply and type(msg) is not w.Failure:
            # An item of a stream: its request is a stream source (zmesh._client.streams).
            req.fut.on_message(conn, req, msg, frames)  # type: ignore[union-attr]
            return
        ok, value = outcome(self.codec, msg, frames, conn.ref)
        if isinstance(req, OneRequest):
            if req.timer is not None:
                req.timer.cancel()
            resolve(req.fut, ok, value)
        else:
            index = req.conns.index(conn) if len(req.conns) > 1 else 0
            self._settle(req, index, ok, value)

    def _settle(self, req: Request, index: int, ok: bool, value: Any) -> None:
        req.open -= 1
        if req.open <= 0 and req.timer is not None:
            req.timer.cancel()
        req.deliver(index, ok, value)

    def _expire(self, req: Request, timeout: float) -> None:
        for i, c in enumerate(req.conns):
            if c.pending.pop(req.id, None) is not None:
                c.bytes -= req.size
                req.deliver(i, False, timeout_error(c.ref, timeout))
                if c.waiting:
                    self._drain(c)
        if req.queued:
            queued, req.queued = sorted(req.queued), None
            for i in queued:
                req.deliver(i, False, timeout_error(req.conns[i].ref, timeout))

    def _expire_one(self, req: OneRequest, timeout: float) -> None:
        c = req.conn
        sent = c.pending.pop(req.id, None) is not None
        resolve(req.fut, False, timeout_error(c.ref, timeout))  # sent or still waiting
        if sent:
            c.bytes -= req.size
            if c.waiting:
                self._drain(c)

    def _fail(self, req: Request | OneRequest, index: int, error: ZmeshError) -> None:
        """Fail ``req`` (its target ``index``, for a fan-out) with ``error``."""
        if isinstance(req, OneRequest):
            if req.timer is not None:
                req.timer.cancel()
            resolve(req.fut, False, error)
        else:
            self._settle(req, index, False, error)

    def _fail_all(self, c: ProcConn, error: ZmeshError) -> None:
        """Fail everything on ``c``, sent or waiting, with ``error``."""
        if self.sync_calls:
            for call in self._sync_calls_to(c):
                call.settle(False, error)
        failed = list(c.pending.values())
        c.pending.clear()
        c.bytes = 0
        waiting = list(c.waiting)
        c.waiting.clear()
        for req in failed:
            self._fail(req, req.conns.index(c) if isinstance(req, Request) else 0, error)
        for _, wreq, i in waiting:
            if isinstance(wreq, OneRequest):
                if not wreq.fut.done():
                    if wreq.timer is not None:
                        wreq.timer.cancel()
                    resolve(wreq.fut, False, error)
            elif wreq is not None and wreq.queued is not None and i in wreq.queued:
                wreq.queued.discard(i)
                self._settle(wreq, i, False, error)

    def break_conn(self, addr: str, error: ZmeshError | None, mesh: str | None = None) -> None:
        """Fail everything in flight to ``addr`` with ``error`` (``None`` heals it).

        A broken connection's socket is closed: what it still queued must not
        run after its call failed, and a healed rank (a partition is over)
        is better served by a fresh connection than by TCP retransmits.

        Args:
            mesh: the mesh whose rank is at ``addr``. A connection there for
                another mesh is left alone, unless ``mesh`` is healthy there
                now: then the other's proc is gone (its port was reused).
        """
        c = self.conns.get(addr)
        if c is None:
            return
        if mesh is not None and c.mesh != mesh:
            if error is None:
                self._drop(c, c.broken or _reused(c, mesh))
            return
        if error is None:
            c.broken = None
            if c.sock is None:
                c.sock = self._socket(c)
            return
        c.broken = error
        self._fail_all(c, error)
        if c.sock is not None:
            c.sock.close()
            c.sock = None

    def _on_disconnect(self, c: ProcConn, sock: AsyncSocket) -> None:
        """A connection of ``c``'s socket dropped: its calls are lost."""
        if c.sock is not sock or c.broken is not None:
            return
        if self.sync_calls:
            sync = self._sync_calls_to(c)
            if sync:
                self.loop.call_later(DISCONNECT_GRACE, self._fail_lost_sync, c, sync)
        if not c.pending:
            return
        lost = list(c.pending)
        # Replaced, not reconnected: the old socket's queue is dropped with
        # it (linger 0), so nothing of a failed call runs later.
        sock.close(linger=0)
        c.sock = self._socket(c)
        self.loop.call_later(DISCONNECT_GRACE, self._fail_lost, c, lost)

    def _sync_calls_to(self, c: ProcConn) -> list[SyncCall]:
        with self.sync_lock:
            calls = self.sync_calls.get(c.ref.addr, ())
            return [call for call in calls if call.ref.mesh == c.mesh]

    def _fail_lost_sync(self, c: ProcConn, lost: list[SyncCall]) -> None:
        err = ConnectionLostError(
            "the connection to the proc dropped with this call on it: "
            "it may or may not have run",
            reason="connection lost", **c.context(),
        )  # fmt: skip
        for call in lost:
            call.settle(False, err)  # unless answered meanwhile

    def _fail_lost(self, c: ProcConn, lost: list[int]) -> None:
        err = ConnectionLostError(
            "the connection to the proc dropped with this call on it: "
            "it may or may not have run",
            reason="connection lost", **c.context(),
        )  # fmt: skip
        for req_id in lost:
            req = c.pending.pop(req_id, None)
            if req is None:
                continue  # answered meanwhile, or failed by supervision
            c.bytes -= req.size
            self._fail(req, req.conns.index(c) if isinstance(req, Request) else 0, err)
        if c.waiting:
            self._drain(c)

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


def _reused(c: ProcConn, mesh: str) -> SupervisionError:
    """The error for calls to ``c``'s proc, gone: its address serves ``mesh`` now."""
    return SupervisionError(
        f"the proc is gone: its address now serves mesh {mesh}", reason="proc gone",
        **c.context(),
    )  # fmt: skip


def _size(frames: list[Any]) -> int:
    return sum(nbytes(f) for f in frames)


def _over(c: ProcConn, size: int) -> bool:
    """Whether ``size`` more bytes would pass ``c``'s limit (one message always goes)."""
    return c.bytes > 0 and c.bytes + size > MAX_IN_FLIGHT_BYTES


def timeout_error(ref: ProcRef, timeout: float) -> CallTimeoutError:
    return CallTimeoutError(
        f"no reply within {timeout}s", mesh=ref.mesh, rank=ref.rank, host=ref.host,
        log_path=ref.log_path or None,
    )  # fmt: skip


def outcome(codec: Codec, msg: Any, frames: list[Any], ref: ProcRef) -> tuple[bool, Any]:
    """``(ok, value)`` of a ``Reply`` (its value) or a ``Failure`` (its error) from ``ref``."""
    if type(msg) is w.Reply:
        try:
            payload = msg.payload
            if payload.blob is None:  # plain: the value is right there
                return True, payload.args[0]
            return True, codec.unpack_value(payload, frames)
        except Exception as exc:
            return False, EncodeError(f"cannot decode reply: {exc!r}")
    return False, failure_error(msg, ref)


def failure_error(msg: w.Failure, ref: ProcRef) -> ZmeshError:
    """The exception for a ``Failure`` message from ``ref``'s proc."""
    ctx: dict[str, Any] = {
        "mesh": ref.mesh, "rank": ref.rank, "host": ref.host, "log_path": ref.log_path or None,
    }  # fmt: skip
    if msg.kind == "actor":
        cause = None
        if msg.exc is not None:
            try:
                cause = pickle.loads(msg.exc)
            except Exception:
                cause = None
        return ActorError(
            msg.type, msg.message, msg.traceback, endpoint=msg.endpoint, cause=cause, **ctx
        )
    if msg.kind == "spawn":
        err = SpawnError(f"actor __init__ raised {msg.type}: {msg.message}", **ctx)
        err.remote_traceback = msg.traceback  # type: ignore[attr-defined]
        return err
    if msg.kind == "endpoint":
        return EndpointError(f"endpoint {msg.endpoint!r}: {msg.message}", **ctx)
    if msg.kind == "encode":
        return EncodeError(msg.message, **ctx)
    if msg.kind == "deadline":
        return CallTimeoutError(f"{msg.endpoint!r}: {msg.message}", **ctx)
    return ActorStoppedError(msg.message, **ctx)


# Set by zmesh._client.lanes: called in a thread without a loop before it
# sends on the I/O path (``Runtime.dispatch``), with the runtime and targets.
before_io: Callable[[Runtime, Iterable[str] | None], None] | None = None


# ---------------------------------------------------------- which runtime

_lock = threading.Lock()
_runtimes: dict[asyncio.AbstractEventLoop, Runtime] = {}
_home: asyncio.AbstractEventLoop | None = None  # where threads without a loop send work
_io_thread: threading.Thread | None = None


def set_home_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Make ``loop`` the runtime for threads that have no loop (used by procs)."""
    global _home
    _home = loop


def current() -> tuple[Runtime, bool]:
    """The runtime for the caller, and whether the caller is on its loop."""
    loop = asyncio._get_running_loop()
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

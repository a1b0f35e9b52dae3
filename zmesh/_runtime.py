"""The client runtime: sockets to procs, requests in flight, and their fates.

A runtime belongs to one asyncio loop and owns every socket it uses (zmq
sockets are not thread-safe). Inside ``async`` code, the runtime lives on the
caller's own loop, so a call is one non-blocking send with no thread hop.
From plain synchronous code, calls go to a runtime on a background loop
thread ("zmesh-io") and the caller blocks on ``Future.get()``.

Requests in flight are kept per proc connection, so when supervision says a
rank failed, exactly the requests sent to it fail, at once, with
``SupervisionError``; later calls to that rank fail before sending.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import pickle
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import msgspec
import zmq

from zmesh import _wire as w
from zmesh._errors import (
    ActorError,
    ActorStoppedError,
    CallTimeoutError,
    EncodeError,
    EndpointError,
    SpawnError,
    ZmeshError,
)
from zmesh._security import secure_client
from zmesh._zsock import BATCH_MARK, AsyncSocket, configure

if TYPE_CHECKING:
    from zmesh._controller import Controller


class ProcRef(msgspec.Struct, frozen=True):
    """Where one rank of a proc mesh lives. Part of every handle, so it travels."""

    mesh: str
    rank: int
    generation: int
    addr: str
    agent: str  # the agent's control address
    host: str  # the agent's label
    log_path: str = ""


class ProcConn:
    """This runtime's DEALER to one proc, and the requests in flight on it."""

    __slots__ = ("broken", "pending", "ref", "sock")

    def __init__(self, ref: ProcRef, sock: AsyncSocket) -> None:
        self.ref = ref
        self.sock = sock
        # In flight on this connection, by request id, in send order. A reply
        # arrives on its connection, so settling it is one pop here.
        self.pending: dict[int, Request | OneRequest] = {}
        self.broken: ZmeshError | None = None  # set: calls fail before sending

    @property
    def inflight(self) -> int:
        """Requests sent on this connection and not answered yet."""
        return len(self.pending)


# Where the answer of a single-target call goes: an asyncio future on the
# runtime's loop, or a concurrent future for a caller blocked in ``.get()``.
# Both are only ever settled from the runtime's loop; a concurrent future is
# marked running before its call is sent, so its caller cannot cancel it.
Sink: TypeAlias = asyncio.Future[Any] | concurrent.futures.Future[Any]


class OneRequest:
    """A call to one proc whose answer settles ``fut`` directly (the fast path)."""

    __slots__ = ("conn", "fut", "id", "timer")

    def __init__(self, req_id: int, conn: ProcConn, fut: Sink) -> None:
        self.id = req_id
        self.conn = conn
        self.fut = fut
        self.timer: asyncio.TimerHandle | None = None


class Request:
    """One message sent to one or more procs, collecting their answers.

    ``deliver(index, ok, value)`` is called once per target: ``ok`` with the
    value, or not ok with the exception.
    """

    __slots__ = ("conns", "deliver", "id", "open", "timer")

    def __init__(
        self, req_id: int, conns: list[ProcConn], deliver: Callable[[int, bool, Any], None]
    ) -> None:
        self.id = req_id
        self.conns = conns
        self.deliver = deliver
        self.open = len(conns)
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
        from zmesh._controller import Controller

        self.loop = loop
        self.ctx: zmq.Context[Any] = zmq.Context.instance()
        self.codec = w.Codec(w.CLIENT_INBOX)
        self._ids = itertools.count(1)
        self.conns: dict[str, ProcConn] = {}
        self.controller: Controller = Controller(self)
        self.closed = False

    # ------------------------------------------------------------ connections

    def conn(self, ref: ProcRef) -> ProcConn:
        """The connection to ``ref``'s proc, made on first use."""
        c = self.conns.get(ref.addr)
        if c is None:
            sock = secure_client(configure(self.ctx.socket(zmq.DEALER)), addr=ref.addr)
            sock.connect(ref.addr)
            c = ProcConn(ref, AsyncSocket(sock, self.loop, None, batch=True))
            c.sock.on_message = functools.partial(self._on_reply, c)
            self.conns[ref.addr] = c
            self.controller.watch(ref)
        return c

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
    ) -> None:
        """Send one ``Call`` to ``ref``'s proc; its answer settles ``fut``.

        The single-target fast path of ``send``: no closures, and the reply
        is one dict pop away from its future.
        """
        c = self.conns.get(ref.addr)
        if c is None:
            c = self.conn(ref)
        if c.broken is not None:
            resolve(fut, False, c.broken)
            return
        req_id = next(self._ids)
        c.sock.send(self.codec.encode(w.Call(req_id, actor, method, payload, deadline), buffers))
        req = OneRequest(req_id, c, fut)
        c.pending[req_id] = req
        if timeout is not None:
            req.timer = self.loop.call_later(timeout, self._expire_one, req, timeout)

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
    ) -> None:
        """``call`` for a caller in another thread (scheduled with ``call_soon_threadsafe``)."""
        if not fut.set_running_or_notify_cancel():
            return  # cancelled before it was sent
        try:
            self.call(ref, actor, method, payload, buffers, deadline, fut, timeout)
        except BaseException as exc:
            resolve(fut, False, exc)

    def send(
        self,
        refs: list[ProcRef],
        msg_for: Callable[[int], Any],
        buffers: list[Any],
        deliver: Callable[[int, bool, Any], None] | None,
        timeout: float | None = None,
    ) -> int:
        """Send one message to every proc in ``refs``; answers go to ``deliver``.

        The message is encoded once, whatever the fan-out. A target already
        known to be broken gets its error delivered at once, without a send.
        """
        req_id = next(self._ids)
        frames = self.codec.encode(msg_for(req_id), buffers)
        conns = [self.conn(r) for r in refs]
        req = Request(req_id, conns, deliver) if deliver is not None else None
        if req is not None and timeout is not None:
            req.timer = self.loop.call_later(timeout, self._expire, req, timeout)
        for i, c in enumerate(conns):
            if c.broken is not None:
                if req is not None:
                    self._settle(req, i, False, c.broken)
                continue
            c.sock.send(frames)
            if req is not None:
                c.pending[req_id] = req
        return req_id

    def _on_reply(self, conn: ProcConn, frames: list[Any]) -> int | None:
        env = frames[0]
        if env and env[0] == BATCH_MARK:
            try:
                msgs = self.codec.decode_batch(env)
            except Exception:  # garbled: dropped; its calls time out or fail
                return None
            for msg in msgs:
                self._on_reply_msg(conn, msg, frames)
            return len(msgs)
        try:
            msg = self.codec.decode(frames)
        except Exception:  # a garbled reply is dropped; its call times out or fails
            return None
        self._on_reply_msg(conn, msg, frames)
        return None

    def _on_reply_msg(self, conn: ProcConn, msg: Any, frames: list[Any]) -> None:
        req = conn.pending.pop(msg.id, None)
        if req is None:
            return  # late answer to a request that already ended
        ok = True
        if type(msg) is w.Reply:
            try:
                payload = msg.payload
                if payload.blob is None:  # plain: the value is right there
                    value = payload.args[0]
                else:
                    value = self.codec.unpack_value(payload, frames)
            except Exception as exc:
                ok, value = False, EncodeError(f"cannot decode reply: {exc!r}")
        else:
            ok, value = False, failure_error(msg, conn.ref)
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
                req.deliver(i, False, _timeout_error(c.ref, timeout))

    def _expire_one(self, req: OneRequest, timeout: float) -> None:
        if req.conn.pending.pop(req.id, None) is not None:
            resolve(req.fut, False, _timeout_error(req.conn.ref, timeout))

    def break_conn(self, addr: str, error: ZmeshError | None) -> None:
        """Fail everything in flight to ``addr`` with ``error`` (``None`` heals it)."""
        c = self.conns.get(addr)
        if c is None:
            return
        c.broken = error
        if error is None:
            return
        failed = list(c.pending.values())
        c.pending.clear()
        for req in failed:
            if isinstance(req, OneRequest):
                if req.timer is not None:
                    req.timer.cancel()
                resolve(req.fut, False, error)
            else:
                self._settle(req, req.conns.index(c), False, error)

    def close(self) -> None:
        """Close every socket (the loop is stopping or gone)."""
        if self.closed:
            return
        self.closed = True
        self.controller.close()
        for c in self.conns.values():
            c.sock.close()
        self.conns.clear()


def _timeout_error(ref: ProcRef, timeout: float) -> CallTimeoutError:
    return CallTimeoutError(
        f"no reply within {timeout}s", mesh=ref.mesh, rank=ref.rank, host=ref.host,
        log_path=ref.log_path or None,
    )  # fmt: skip


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

"""Connections to procs and their backpressure: one DEALER per proc address.

A ``ProcConn`` holds the requests sent on it and not answered (``pending``)
and those not sent yet (``waiting``). At most ``MAX_IN_FLIGHT`` calls (and
``MAX_IN_FLIGHT_BYTES`` of large messages) are sent and unanswered on one
connection; later calls wait in ``waiting``, in send order, and go out
(``drain``) as replies come back or calls time out; with ``block=False``
they fail with ``OverloadedError`` instead (``wait``). So no ZeroMQ pipe ever
nears its high-water mark: a full pipe stops libzmq reading the connection,
and a reconnect then trips libzmq's ``_input_stopped`` assertion (libzmq
issues 3937, 4767).

``Connections`` is the part of the runtime (``zmesh._client.calls.runtime``) that
makes, breaks, heals and releases them. A connection that drops (its socket
monitor reports it) takes the calls that were on it: they fail with
``ConnectionLostError`` unless supervision explains the drop first (a
crash), and the socket is replaced, so nothing it still queued can run after
its call has failed.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

from zmesh._client.calls import inflight as _inflight
from zmesh._client.calls.inflight import OneRequest, Request, fail, resolve, settle, timeout_error
from zmesh._client.control.controller import AGENT_TIMEOUT
from zmesh._errors import ConnectionLostError, OverloadedError, SupervisionError, ZmeshError
from zmesh._wire.codec import BIG_BUFFER, nbytes
from zmesh._wire.security import secure_client
from zmesh._wire.zsock import AsyncSocket, configure

if TYPE_CHECKING:
    from zmesh._client.calls.lanes import Lane
    from zmesh._client.calls.runtime import ProcRef
    from zmesh._client.calls.synccall import SyncCall
    from zmesh._client.calls.tree import Tree
    from zmesh._client.control.controller import Controller


# Calls sent on one proc connection and not answered yet, at most: a tenth
# of the sockets' high-water mark (zmesh._wire.zsock.HWM), so no pipe fills.
# The runtime imports it by value (it is read on every call): to change it
# at run time, set it in both modules.
MAX_IN_FLIGHT = int(os.environ.get("ZMESH_MAX_IN_FLIGHT", "10000"))
# Bytes of large messages (BIG and over) in flight on one connection, at
# most; a message larger than this still goes, alone.
MAX_IN_FLIGHT_BYTES = int(os.environ.get("ZMESH_MAX_IN_FLIGHT_BYTES", str(1 << 30)))
BIG = BIG_BUFFER
# After a connection drops, how long its calls wait for supervision to say
# why before they fail with ConnectionLostError: a crash is reported by the
# agent at once, a lost host once its agent is silent for AGENT_TIMEOUT.
DISCONNECT_GRACE = AGENT_TIMEOUT + 0.5
# A proc's last answer and the news of its end travel apart (the answer on
# its socket, the news from its agent): an endpoint's SystemExit is answered,
# then the proc exits, and the news can come first. A sync call whose proc
# ended waits this long for an answer on its way before it fails.
REPLY_GRACE = 0.1


class ProcConn:
    """This runtime's DEALER to one proc, and the requests in flight on it."""

    __slots__ = (
        "abandoned", "broken", "bytes", "mesh", "pending", "ref", "sock", "waiting", "watchers",
    )  # fmt: skip

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
        # Told when this connection fails: waits that outlive their request (an
        # explicit response port the proc still holds after its endpoint returned).
        self.watchers: list[Callable[[ZmeshError], None]] = []
        # Calls given up on (cancelled, timed out) the proc has not answered:
        # request id -> (why, when); see zmesh._client.calls.cancels.
        self.abandoned: dict[int, tuple[str, float]] = {}

    @property
    def inflight(self) -> int:
        """Requests on this connection not answered yet (sent or waiting)."""
        return len(self.pending) + len(self.waiting)

    def context(self) -> dict[str, Any]:
        """The error context of this connection's proc."""
        r = self.ref
        return {"mesh": r.mesh, "rank": r.rank, "host": r.host, "log_path": r.log_path or None}


def wait(
    c: ProcConn, frames: list[Any], req: Request | OneRequest | None, i: int, block: bool
) -> None:
    """Queue a message behind the in-flight limit (or fail it: ``block=False``)."""
    if req is not None and not block:
        err = OverloadedError(
            f"{len(c.pending)} calls from this caller are in flight to this proc "
            f"(limit {MAX_IN_FLIGHT} calls, {MAX_IN_FLIGHT_BYTES:,} bytes of large "
            "messages); the call was not sent",
            **c.context(),
        )  # fmt: skip
        fail(req, i, err)
        return
    if isinstance(req, Request):
        if req.queued is None:
            req.queued = set()
        req.queued.add(i)
    c.waiting.append((frames, req, i))


def drain(c: ProcConn) -> None:
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
            if len(pending) >= MAX_IN_FLIGHT or (req.size and over(c, req.size)):
                return
        waiting.popleft()
        c.sock.send(frames)
        if req is not None:
            if isinstance(req, Request):
                req.queued.discard(i)  # type: ignore[union-attr]
            pending[req.id] = req
            c.bytes += req.size


def expire(req: Request, timeout: float) -> None:
    """``req``'s timeout passed: its targets not answered yet fail."""
    for i, c in enumerate(req.conns):
        if c.pending.pop(req.id, None) is not None:
            c.bytes -= req.size
            req.deliver(i, False, timeout_error(c.ref, timeout))
            if c.waiting:
                drain(c)
    if req.queued:
        queued, req.queued = sorted(req.queued), None
        for i in queued:
            req.deliver(i, False, timeout_error(req.conns[i].ref, timeout))


def expire_one(req: OneRequest, timeout: float) -> None:
    """``req``'s timeout passed: it fails, and its slot on the connection frees."""
    c = req.conn
    sent = c.pending.pop(req.id, None) is not None
    why = _inflight.hint(c.abandoned, _inflight.ahead_of(c.pending, req.id)) if sent else ""
    resolve(req.fut, False, timeout_error(c.ref, timeout, why))  # sent or still waiting
    if sent:
        _inflight.abandon(c.abandoned, req.id, "timed out")
        c.bytes -= req.size
        if c.waiting:
            drain(c)


def _reused(c: ProcConn, mesh: str) -> SupervisionError:
    """The error for calls to ``c``'s proc, gone: its address serves ``mesh`` now."""
    return SupervisionError(
        f"the proc is gone: its address now serves mesh {mesh}", reason="proc gone",
        **c.context(),
    )  # fmt: skip


def frames_size(frames: list[Any]) -> int:
    """The bytes of a message's frames."""
    return sum(nbytes(f) for f in frames)


def over(c: ProcConn, size: int) -> bool:
    """Whether ``size`` more bytes would pass ``c``'s limit (one message always goes)."""
    return c.bytes > 0 and c.bytes + size > MAX_IN_FLIGHT_BYTES


class Connections:
    """The runtime's connections to procs, by address: made, broken, healed, released.

    A base of ``zmesh._client.calls.runtime.Runtime``, which owns the state below.
    """

    if TYPE_CHECKING:
        loop: asyncio.AbstractEventLoop
        ctx: zmq.Context[Any]
        conns: dict[str, ProcConn]
        controller: Controller
        sync_lock: threading.Lock
        lanes: weakref.WeakSet[Lane]
        tree: Tree | None

        def _on_reply(self, conn: ProcConn, frames: list[Any]) -> int | None: ...

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
        if self.tree is not None:
            self.tree.forget(mesh)

    def _drop(self, c: ProcConn, error: ZmeshError) -> None:
        if self.conns.get(c.ref.addr) is c:
            del self.conns[c.ref.addr]
        c.broken = error
        self._fail_all(c, error)
        if c.sock is not None:
            c.sock.close()
            c.sock = None

    def _fail_all(self, c: ProcConn, error: ZmeshError) -> None:
        """Fail everything on ``c``, sent or waiting, with ``error``.

        What the proc answered before it ended still counts: an answer
        already read off the socket settles its call first (``drain``), and
        a sync call's waiting thread, which reads its own socket, gets
        ``REPLY_GRACE`` to read one on its way.
        """
        if self.lanes:
            for call in self._sync_calls_to(c):
                self.loop.call_later(REPLY_GRACE, call.settle, False, error)
        if c.sock is not None and c.pending and not c.sock.reading:
            c.sock.drain()
        failed = list(c.pending.values())
        c.pending.clear()
        c.bytes = 0
        waiting = list(c.waiting)
        c.waiting.clear()
        for req in failed:
            fail(req, req.conns.index(c) if isinstance(req, Request) else 0, error)
        watchers, c.watchers = c.watchers, []
        for watcher in watchers:
            watcher(error)
        for _, wreq, i in waiting:
            if isinstance(wreq, OneRequest):
                if not wreq.fut.done():
                    if wreq.timer is not None:
                        wreq.timer.cancel()
                    resolve(wreq.fut, False, error)
            elif wreq is not None and wreq.queued is not None and i in wreq.queued:
                wreq.queued.discard(i)
                settle(wreq, i, False, error)

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
        if self.tree is not None and error is not None:  # its calls behind relays fail too
            self.tree.broken(addr, error, mesh)
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
        if self.lanes:
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
            lanes = list(self.lanes)
        addr, mesh = c.ref.addr, c.mesh
        return [call for lane in lanes for call in lane.calls_to(addr, mesh)]

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
            fail(req, req.conns.index(c) if isinstance(req, Request) else 0, err)
        if c.waiting:
            drain(c)

"""ZeroMQ sockets on an asyncio loop, the fast way.

``zmq.asyncio`` was measured ~6x slower pipelined on this kind of machine than
an asyncio loop that waits on the socket's ``ZMQ_FD`` with ``add_reader`` and
does non-blocking sends and receives. This module is that second style.

``ZMQ_FD`` is edge-triggered: it signals that the socket's state *may* have
changed, and any send or receive may consume the edge. So the handler reads
``EVENTS`` in a loop until there is nothing to do, and every send outside the
handler re-checks ``EVENTS`` and schedules the handler if input is waiting.

Batching: on a socket made with ``batch=True``, single-frame messages to one
peer that are sent while a handler run is due (the first of a loop turn goes
out at once) are coalesced into one ZeroMQ frame, a *batch*. The profile of a
pipelined caller showed a third of each side's CPU in ZeroMQ's per-message
send and receive (each send wakes libzmq's I/O thread); a batch pays that once
for up to ``BATCH_MAX`` messages. The receiver tells a batch by its first byte
(``BATCH_MARK``, which msgpack never uses) and decodes it in one call; the
format is the codec's (``zmesh._wire.codec.encode_batch``, ``Codec.decode_frames``).

Sharing: a ZeroMQ socket is not thread-safe. After ``share()`` one other
thread may send on it too (``send_from_thread``: a proc's actor thread
answering its own call, one loop wake-up fewer per call); every use of the
socket then holds its lock, and a send from the other thread reads
``EVENTS`` after it and wakes the loop if input waits, since the send may have
taken the edge of input the loop sleeps on.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

# MAX_MSG_SIZE: one frame at most; a larger one makes the receiver drop the
# connection, so senders refuse it first (``Codec.encode``). BATCH_MARK: the
# first byte of a batch frame. Both are the codec's; re-exported here.
from zmesh._wire.codec import BATCH_MARK as BATCH_MARK
from zmesh._wire.codec import MAX_MSG_SIZE as MAX_MSG_SIZE
from zmesh._wire.codec import encode_batch

# (EVENTS/POLLIN as plain ints, the Cython getsockopt: shared with the thread side)
from zmesh._wire.zshare import _EVENTS, _POLLIN, ThreadSend, _check_buffers, _Frame, _get

# Messages handled per wake-up before yielding to other tasks.
_BATCH = 256

# Plain ints: pyzmq's enum flags cost a Python-level __and__/__or__ per use,
# which the profile showed at 10-19 % of a busy proc's CPU.
_POLLOUT = int(zmq.POLLOUT)
_NOBLOCK = int(zmq.NOBLOCK)
_DISCONNECTED = int(zmq.EVENT_DISCONNECTED)
_MORE = int(zmq.SNDMORE) | _NOBLOCK
# pyzmq's Python-level Socket.send/recv wrappers only add DRAFT routing_id/group
# handling; the Cython methods underneath save ~0.6 µs per frame.
_send = zmq.backend.Socket.send
_recv = zmq.backend.Socket.recv
# Below this a zero-copy send costs more (a Frame, pyzmq's GC thread) than a memcpy.
_ZERO_COPY_MIN = 1 << 20

# A full batch goes out at once, so the peer starts on it while more are made:
# both ends keep working instead of taking turns.
BATCH_MAX = 64
# Nor does a batch wait behind slow work: once its oldest message has waited
# this long (handlers that run long, or a caller computing between sends),
# the next send or handled message flushes it.
BATCH_LINGER = 0.001  # seconds
_now = time.monotonic

# Bounded linger: a message queued to a dead peer must never hang close/term.
LINGER_MS = 200
# Well above any in-flight limit zmesh applies (``zmesh._client.calls.runtime``), so a
# pipe never reaches it: a full receive pipe makes libzmq stop reading the
# connection (and meets libzmq's ``_input_stopped`` bug on reconnect).
HWM = 100_000


def configure(sock: Any, *, data: bool = False, addr: str | None = None) -> Any:
    """Apply zmesh's deliberate socket options.

    Args:
        data: a client <-> proc call socket. ZMTP heartbeats stay off there:
            a PING waits behind a long transfer and goes unanswered while a
            receive pipe is full, and the timeout would drop the connection
            with every queued call on it. Liveness on the data path is
            zmesh's own (agent and proc heartbeats); TCP keepalive (idle
            connections only) lets a peer that vanished be noticed at last.
            Control and event-stream sockets carry small messages and keep
            100/500 ms heartbeats, which notice a cut link in ~0.5 s.
        addr: the address the socket will bind or connect to. On a link
            within this machine (``ipc://``, ``inproc://``) no link can be
            cut and the kernel tells at once that a peer died, so control
            sockets there have no ZMTP heartbeats either. They would do
            harm: libzmq 4.3.5 aborts the whole process (``!_io_error``,
            stream_engine_base.cpp) when a heartbeat falls due on a
            connection that had stopped reading (its pipe full, or its
            socket being closed) when its peer hung up, as an agent being
            stopped does. ``None``: the link is not known (heartbeats on).
    """
    sock.setsockopt(zmq.LINGER, LINGER_MS)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MSG_SIZE)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.RCVHWM, HWM)
    if data:
        sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
        sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, 30)
        sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, 10)
        sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, 3)
    elif not local_link(addr):
        # Measured: 100/500 ms ZMTP heartbeats notice a cut link in ~0.5 s;
        # the defaults never notice it.
        sock.setsockopt(zmq.HEARTBEAT_IVL, 100)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 500)
        sock.setsockopt(zmq.HEARTBEAT_TTL, 1000)
    return sock


def local_link(addr: str | None) -> bool:
    """Whether ``addr`` is a link within this machine (``ipc://``, ``inproc://``)."""
    return addr is not None and addr.startswith(("ipc://", "inproc://"))


class AsyncSocket(ThreadSend):
    """A ZeroMQ socket driven by an asyncio loop, delivering to a callback.

    The socket belongs to the loop's thread: create, use and close it there.

    Args:
        sock: the ZeroMQ socket (bound or connected already, or later).
        loop: the loop whose thread owns the socket.
        on_message: called with the frames of each message. For a ROUTER the
            frames are ``[identity, envelope, *buffers]``, else
            ``[envelope, *buffers]``; the envelope (and identity) are
            ``bytes`` and buffers are zero-copy ``zmq.Frame``. It may return
            how many messages the frames held (a batch), for fairness.
        router: whether the first frame is a routing identity.
        batch: whether to coalesce small messages into batches (the peer
            must understand them).
    """

    def __init__(
        self,
        sock: Any,
        loop: asyncio.AbstractEventLoop,
        on_message: Callable[[list[Any]], int | None] | None,
        *,
        router: bool = False,
        batch: bool = False,
    ) -> None:
        self.sock = sock
        self.loop = loop
        self.on_message = on_message
        self._heads = 2 if router else 1
        self._pending: deque[list[Any]] = deque()
        self._batch = batch
        # Envelopes waiting to go out as one batch, per peer identity (None
        # for a socket with one peer); flushed by _on_ready.
        self._outbox: dict[bytes | None, list[bytes]] = {}
        self._since = 0.0  # when the oldest message in the outbox was queued
        self._scheduled = False
        self._reading = False  # inside _on_ready, whose loop re-reads EVENTS
        self.paused = False  # reads stop (sends go on): see pause()
        self.closed = False
        self.sent = 0
        self.received = 0
        self.unroutable = 0
        self._fd = sock.getsockopt(zmq.FD)
        loop.add_reader(self._fd, self._on_ready)
        self._schedule()
        self.on_disconnect: Callable[[], None] | None = None
        self._monitor: AsyncSocket | None = None
        # Held around every use of the socket once another thread may send
        # on it too (``share``); None before, so an unshared socket pays nothing.
        self.lock: threading.RLock | None = None

    def watch_disconnects(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the loop) each time a connection of this
        socket drops: the messages that were on it are gone. Uses a ZeroMQ
        socket monitor (two more inproc sockets)."""
        self.on_disconnect = callback
        if self._monitor is None:
            mon = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            self._monitor = AsyncSocket(mon, self.loop, self._on_monitor)

    def _on_monitor(self, frames: list[Any]) -> None:
        # A monitor event is [uint16 event, uint32 value] then the endpoint.
        event = int.from_bytes(frames[0][:2], "little")
        if event == _DISCONNECTED and not self.closed and self.on_disconnect is not None:
            self.on_disconnect()

    def pause(self) -> None:
        """Stop reading (sends go on). What the peers send waits in ZeroMQ,
        then in TCP: the senders meet backpressure, nothing is dropped."""
        self.paused = True

    def resume(self) -> None:
        """Read again after ``pause``."""
        if self.paused:
            self.paused = False
            self._schedule()

    def send(self, frames: list[Any]) -> None:
        """Queue ``frames`` as one message; never blocks.

        A message that ZeroMQ cannot take now (high-water mark) waits in an
        in-process queue, in order, until the socket is writable. On a
        batching socket, a small message sent while the reader is due to run
        waits in the outbox for that run (this loop turn), a full batch, or
        ``BATCH_LINGER``, whichever comes first.
        """
        if self.closed:
            return
        if self._batch and (self._reading or self._scheduled):
            # _on_ready runs before the loop sleeps and flushes the outbox.
            if len(frames) == self._heads:  # one envelope, no buffers: batch it
                key = frames[0] if self._heads == 2 else None
                box = self._outbox.get(key)
                if box is None:
                    self._outbox[key] = [frames[-1]]
                    if not self._since:
                        self._since = _now()
                else:
                    box.append(frames[-1])
                    if len(box) >= BATCH_MAX:
                        self._flush_box(key)
                    elif _now() - self._since > BATCH_LINGER:
                        self._flush_outbox()
                return
        if self._outbox:  # keep this peer's order: its batch goes first
            key = frames[0] if self._heads == 2 else None
            if key in self._outbox:
                self._flush_box(key)
        self._send_or_queue(frames)
        # The send may have consumed the edge of input that arrived meanwhile,
        # so EVENTS must be read again before the loop sleeps. Inside
        # _on_ready its loop does that; elsewhere one scheduled _on_ready
        # does it for every send of this loop turn (a getsockopt costs ~3 µs,
        # and a pipelining caller sends hundreds of messages per turn).
        if not self._reading:
            self._schedule()

    def _flush_box(self, key: bytes | None) -> None:
        envs = self._outbox.pop(key)
        if not self._outbox:
            self._since = 0.0
        frame = envs[0] if len(envs) == 1 else encode_batch(envs)
        self._send_or_queue([key, frame] if key is not None else [frame])

    def _flush_outbox(self) -> None:
        for key in list(self._outbox):
            self._flush_box(key)

    def _send_or_queue(self, frames: list[Any]) -> None:
        """Send now, or queue behind messages the high-water mark holds back."""
        if self._pending:
            self._pending.append(frames)
            return
        try:
            self._send_now(frames)
            self.sent += 1
        except zmq.Again:
            self._pending.append(frames)
            self._schedule()
            return
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:  # ROUTER_MANDATORY: peer is gone
                self.unroutable += 1
                return
            raise

    def _send_now(self, frames: list[Any]) -> None:
        lock = self.lock
        if lock is None:
            self._send_parts(frames)
        else:
            with lock:
                self._send_parts(frames)

    def _send_parts(self, frames: list[Any]) -> None:
        # A multipart message is atomic in ZeroMQ: once the first part is
        # accepted, the rest are too, so EAGAIN can only come from part one.
        sock = self.sock
        last = len(frames) - 1
        if last:
            _check_buffers(frames)
        for i, f in enumerate(frames):
            t = type(f)
            if t is bytes:
                copy = len(f) < _ZERO_COPY_MIN
            elif t is _Frame:
                copy = False  # a received message: ZeroMQ shares it by reference count
            elif (
                t is memoryview
                and type(f.obj) is _Frame
                and f.c_contiguous  # not, say, reversed: the bytes in order
                and f.nbytes == len(f.obj)
            ):
                # A whole received frame going out again (an echo, a relay):
                # send the message itself, which ZeroMQ shares by reference
                # count, instead of wrapping its memory for pyzmq's GC thread.
                f = f.obj
                copy = False
            else:
                # Any other buffer: a small one is copied, like small bytes
                # (a zero-copy send of 8 bytes cost ~50 µs in pyzmq's GC thread).
                n = f.nbytes if t is memoryview else memoryview(f).nbytes
                copy = n < _ZERO_COPY_MIN
            _send(sock, f, _MORE if i < last else _NOBLOCK, copy)

    def _schedule(self) -> None:
        if not self._scheduled and not self.closed:
            self._scheduled = True
            self.loop.call_soon(self._on_ready)

    def drain(self) -> None:
        """Handle whatever has arrived now, without waiting for the loop's turn."""
        self._on_ready()

    @property
    def reading(self) -> bool:
        """Whether its handler is running now (a ``drain`` from it would re-enter)."""
        return self._reading

    def recheck(self) -> None:
        """Look at the socket's events again in this loop turn.

        For code that used ``sock`` directly (a send or a getsockopt may
        consume the edge of input that arrived meanwhile, and the loop would
        not wake for it).
        """
        if not self._reading:
            self._schedule()

    def _on_ready(self) -> None:
        self._scheduled = False
        if self.closed:
            return
        sock = self.sock
        heads = self._heads
        lock = self.lock
        handled = 0
        self._reading = True
        try:
            while True:
                # Once shared, the lock is held from here to the message's
                # last part (one acquire per message), never over a handler.
                if lock is not None:
                    lock.acquire()
                try:
                    if self._outbox:
                        self._flush_outbox()
                    events = _get(sock, _EVENTS)
                    if events & _POLLOUT and self._pending:
                        self._flush()
                    if not events & _POLLIN or self.paused:
                        if self._outbox:  # made by handlers in this run: send, look again
                            continue
                        return
                    if handled >= _BATCH:
                        self._flush_outbox()
                        self._schedule()  # let other tasks run, then continue
                        return
                    # Frame.more is cheaper than a getsockopt(RCVMORE) per part.
                    # Heads (identity, envelope) become bytes; buffers stay
                    # zero-copy Frames.
                    part = _recv(sock, _NOBLOCK, False)
                    frames: list[Any] = [part.bytes]
                    while part.more:
                        part = _recv(sock, _NOBLOCK, False)
                        frames.append(part.bytes if len(frames) < heads else part)
                except zmq.Again:
                    continue
                finally:
                    if lock is not None:
                        lock.release()
                self.received += 1
                if self.on_message is not None:
                    handled += self.on_message(frames) or 1
                    if self._outbox and _now() - self._since > BATCH_LINGER:
                        self._flush_outbox()  # replies must not wait behind slow handlers
                else:
                    handled += 1
                if self.closed:
                    return
        finally:
            self._reading = False
            if self._outbox:  # a handler raised mid-pass: flush on the next turn
                self._schedule()

    def _flush(self) -> None:
        pending = self._pending
        while pending:
            try:
                self._send_now(pending[0])
                self.sent += 1
            except zmq.Again:
                return
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH:
                    raise
                self.unroutable += 1
            pending.popleft()

    def close(self, linger: int = LINGER_MS) -> None:
        """Stop reading and close the socket with a bounded linger (ms)."""
        if self.closed:
            return
        if self._outbox:
            self._flush_outbox()
        self.closed = True
        try:
            self.loop.remove_reader(self._fd)
        except (ValueError, RuntimeError):  # loop already closed
            pass
        if self._monitor is not None:
            try:
                self.sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self._monitor.close(linger=0)
        with self.guard():
            self.sock.close(linger=linger)

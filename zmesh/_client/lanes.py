"""The sync path without hops: a thread with no event loop calls procs itself.

From plain code, a call normally goes to the runtime's I/O thread and its
reply comes back through it: two thread hops (a wake-up each) per call. A
*lane* is one thread's own DEALER per proc, driven by that thread: a sync
``call_one`` encodes and sends on it at once, and ``.get()`` is a blocking
``recv`` on it. No other thread is woken. (A blocking ``recv`` costs about
half the CPU of ``zmq_poll`` then ``recv``, measured.)

What the lane cannot do it leaves to the I/O thread (the *I/O path*): a first
call to a proc (the runtime must connect to it and follow its supervision),
a proc that is broken or released, buffers, a full in-flight window, and
every other adverb. The guarantees stay those of the I/O path:

* **Failures.** Every lane call is registered with the runtime
  (``Runtime.sync_calls``) before it is sent. Supervision runs on the I/O
  thread; when it breaks a proc's connection it fails that proc's lane calls
  too (``SyncCall.settle``). The caller's ``recv`` gives up every
  ``SLICE_MS`` to look, so a killed proc fails ``.get()`` with
  ``SupervisionError`` at most that much later than on the I/O path. A
  dropped connection fails them after the same grace
  (``ConnectionLostError``); a per-call timeout is kept by the wait.
* **Order per caller.** A thread's messages to one proc must arrive in the
  order it sent them, but a lane and the runtime's socket are two
  connections. So (1) before the thread sends anything on the I/O path
  (``before_io``), it waits for the replies of its lane calls to those
  procs; and (2) a call goes on the lane only when every earlier I/O-path
  message of the thread to that proc is known to have arrived: the thread's
  last I/O-path message to it was a ``call_one`` that was answered.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import zmq

from zmesh._client import runtime as _runtime
from zmesh._client.connections import MAX_IN_FLIGHT
from zmesh._client.inflight import outcome, timeout_error
from zmesh._client.runtime import ProcRef
from zmesh._errors import ActorError, EncodeError
from zmesh._wire import messages as w
from zmesh._wire.codec import BATCH_MARK, Codec
from zmesh._wire.security import secure_client
from zmesh._wire.zsock import configure

if TYPE_CHECKING:
    from collections.abc import Iterable

    from zmesh._client.runtime import Runtime

_NOBLOCK = int(zmq.NOBLOCK)
_RCVTIMEO = int(zmq.RCVTIMEO)
# The Cython methods under pyzmq's Python wrappers (see zmesh._wire.zsock).
_send = zmq.backend.Socket.send
_recv = zmq.backend.Socket.recv
_monotonic = time.monotonic
# A blocked .get() looks up at least this often (ms): for a failure that
# supervision delivered meanwhile, and to let another waiter drive the lane.
SLICE_MS = 20
_SLICE_S = SLICE_MS / 1000


class SyncCall:
    """One call in flight on a lane; settled once, by a reply or a failure."""

    __slots__ = ("done", "expires", "id", "lane", "ok", "ref", "timeout", "value")

    def __init__(self, lane: Lane, ref: ProcRef, req_id: int, timeout: float | None) -> None:
        self.lane = lane
        self.ref = ref
        self.id = req_id
        self.timeout = timeout
        self.expires = time.monotonic() + timeout if timeout is not None else 0.0
        self.done = False
        self.ok = False
        self.value: Any = None

    def settle(self, ok: bool, value: Any) -> None:
        """Give the call its outcome (the first one wins), from any thread."""
        lane = self.lane
        rt = lane.rt
        with rt.sync_lock:
            if self.done:
                return
            self.ok, self.value, self.done = ok, value, True
            by_addr = rt.sync_calls
            calls = by_addr.get(addr := self.ref.addr)
            if calls is not None:
                calls.discard(self)
                if not calls:
                    del by_addr[addr]
        lane.calls.pop(self.id, None)

    def result(self, timeout: float | None) -> Any:
        """Wait (``None``: as long as it takes) and return the value or raise the error.

        Raises:
            TimeoutError: ``timeout`` passed first (the call goes on).
        """
        if not self.done:
            self.lane.wait(self, timeout)
            if not self.done:
                raise TimeoutError
        if self.ok:
            return self.value
        raise self.value

    def poll(self) -> bool:
        """Whether it is done, reading what has arrived (never blocks)."""
        if not self.done:
            self.lane.wait(self, 0.0)
        return self.done


class Lane:
    """One thread's sockets to procs, and its calls in flight on them.

    Used by its thread; another thread waiting on one of its calls takes
    ``lock`` to drive the sockets for a moment (a ZeroMQ socket may change
    threads behind a lock).
    """

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.thread = threading.get_ident()
        self.codec = Codec(w.CLIENT_INBOX)
        self.lock = threading.Lock()
        self.socks: dict[str, Any] = {}
        self.calls: dict[int, SyncCall] = {}
        self._ids = itertools.count(1)
        self._timeo: dict[str, int] = {}  # each socket's RCVTIMEO now (ms)
        # Order with the I/O path (see the module docstring): the sequence
        # number of the thread's last I/O-path message to each proc (and to
        # procs unknown: ``io_all``), and of its last answered I/O call_one.
        self.io_seq = 0
        self.io_all = 0
        self.io_to: dict[str, int] = {}
        self.proven: dict[str, int] = {}

    # ------------------------------------------------------------ sending

    def call(
        self,
        ref: ProcRef,
        actor: str,
        method: str,
        payload: w.Payload,
        deadline: float,
        timeout: float | None,
    ) -> SyncCall | None:
        """Send a call on the lane; ``None``: it must take the I/O path.

        Raises:
            EncodeError: the message is over the size limit.
        """
        addr = ref.addr
        rt = self.rt
        c = rt.conns.get(addr)
        proven = self.proven.get(addr, -1)
        if (
            c is None
            or c.mesh != ref.mesh
            or c.broken is not None
            or proven < self.io_all
            or proven < self.io_to.get(addr, 0)
            or len(self.calls) >= MAX_IN_FLIGHT
        ):
            return None
        req_id = next(self._ids)
        try:
            frames = self.codec.encode(w.Call(req_id, actor, method, payload, deadline))
        except EncodeError as exc:
            raise EncodeError(
                f"arguments of {method!r} cannot be sent: {exc.message}", **c.context()
            ) from exc
        call = SyncCall(self, ref, req_id, timeout)
        with rt.sync_lock:
            # Registered before the check: a break from now on fails it; one
            # before shows in the connection (broken is set before calls fail).
            calls = rt.sync_calls.get(addr)
            if calls is None:
                rt.sync_calls[addr] = {call}
            else:
                calls.add(call)
        if rt.conns.get(addr) is not c or c.broken is not None:
            call.settle(False, None)  # unregister; the I/O path says why
            return None
        self.calls[req_id] = call
        with self.lock:
            sock = self.socks.get(addr)
            if sock is None:
                sock = self.socks[addr] = self._connect(addr)
            _send(sock, frames[0], _NOBLOCK)  # the HWM is far above MAX_IN_FLIGHT
        return call

    def _connect(self, addr: str) -> Any:
        sock = secure_client(
            configure(zmq.Context.instance().socket(zmq.DEALER), data=True), addr=addr
        )
        sock.setsockopt(zmq.RCVTIMEO, SLICE_MS)
        self._timeo[addr] = SLICE_MS
        sock.connect(addr)
        return sock

    # ------------------------------------------------------------ waiting

    def wait(self, call: SyncCall, timeout: float | None) -> None:
        """Drive the lane until ``call`` is done, ``timeout`` passes, or it expires."""
        now = _monotonic()
        until = now + timeout if timeout is not None else None
        addr = call.ref.addr
        lock = self.lock
        while not call.done:
            expires = call.expires
            if expires and now >= expires:
                assert call.timeout is not None
                call.settle(False, timeout_error(call.ref, call.timeout))
                return
            ms = SLICE_MS
            if until is not None and until - now < _SLICE_S:
                ms = int((until - now) * 1000 + 0.999)
            if expires and expires - now < _SLICE_S:
                ms = min(ms, int((expires - now) * 1000 + 0.999))
            # Uncontended (the usual case) without the timed acquire's cost.
            if not lock.acquire(False) and not lock.acquire(timeout=_SLICE_S):
                now = _monotonic()
                if until is not None and now >= until:
                    return
                continue  # another thread drives the lane: it may settle ours
            try:
                if not call.done:
                    self._receive(addr, ms)
            finally:
                lock.release()
            now = _monotonic()
            if until is not None and now >= until:
                return

    def _receive(self, addr: str, ms: int) -> None:
        """Wait up to ``ms`` for a message on ``addr``'s socket (0: do not
        wait); settle its calls. The lock is held."""
        sock = self.socks.get(addr)
        if sock is None:
            return
        try:
            if ms <= 0:
                frame = _recv(sock, _NOBLOCK, False)
            else:
                if self._timeo[addr] != ms:
                    sock.setsockopt(_RCVTIMEO, ms)
                    self._timeo[addr] = ms
                frame = _recv(sock, 0, False)
        except zmq.Again:
            return
        # A zmq.Frame: its ``more`` is cheaper than getsockopt(RCVMORE)
        # (measured); the envelope is copied out, the buffers stay frames.
        env = frame.bytes
        if not frame.more and env and env[0] != BATCH_MARK:
            # The usual reply: one message, no buffers, settled right here.
            try:
                msg = self.codec.decode_envelope(env)
            except Exception:  # garbled: dropped; its call times out or fails
                return
            call = self.calls.get(msg.id)
            if call is not None:
                ok, value = outcome(self.codec, msg, [env], call.ref)
                call.settle(ok, value)
            return
        frames: list[Any] = [env]
        while frame.more:
            frame = _recv(sock, _NOBLOCK, False)
            frames.append(frame)
        self._on_reply(frames)

    def _on_reply(self, frames: list[Any]) -> None:
        try:
            msgs = self.codec.decode_frames(frames)
        except Exception:  # garbled: dropped; its call times out or fails
            return
        for msg in msgs:
            call = self.calls.get(msg.id)
            if call is not None:
                ok, value = outcome(self.codec, msg, frames, call.ref)
                call.settle(ok, value)

    # ------------------------------------------------------------ the I/O path

    def before_io(self, targets: Iterable[str] | None) -> int:
        """The thread sends on the I/O path to ``targets`` (``None``: unknown).

        First wait for the replies of its lane calls to them, so nothing sent
        later overtakes them; return the message's sequence number.
        """
        addrs = None if targets is None else set(targets)
        if self.calls:
            for call in list(self.calls.values()):
                if addrs is None or call.ref.addr in addrs:
                    self.wait(call, None)
        self.io_seq += 1
        if addrs is None:
            self.io_all = self.io_seq
        else:
            for addr in addrs:
                self.io_to[addr] = self.io_seq
        return self.io_seq

    def answered(self, addr: str, seq: int, fut: Any) -> None:
        """An I/O-path call_one (message ``seq``) to ``addr`` ended: if the proc
        answered it, everything the thread sent before it has arrived there."""
        exc = fut.exception() if not fut.cancelled() else None
        if not fut.cancelled() and (exc is None or isinstance(exc, ActorError)):
            if seq > self.proven.get(addr, 0):
                self.proven[addr] = seq

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close(linger=0)
        self.socks.clear()

    def __del__(self) -> None:
        self.close()


_local = threading.local()


def _forget_after_fork() -> None:
    # In a forked child the lane of the thread that forked is the parent's:
    # its sockets are neither used nor closed there. (A hook, not a pid test
    # per call: getpid is a system call.)
    ln: Lane | None = getattr(_local, "lane", None)
    if ln is not None:
        ln.socks.clear()
        ln.calls.clear()
        _local.lane = None


os.register_at_fork(after_in_child=_forget_after_fork)


def lane(rt: Runtime) -> Lane:
    """The calling thread's lane to ``rt``'s procs (made on first use)."""
    ln: Lane | None = getattr(_local, "lane", None)
    if ln is None or ln.rt is not rt:
        ln = _local.lane = Lane(rt)
    return ln


def existing(rt: Runtime) -> Lane | None:
    """The calling thread's lane to ``rt``, if it has one."""
    ln: Lane | None = getattr(_local, "lane", None)
    return ln if ln is not None and ln.rt is rt else None


def _before_io(rt: Runtime, targets: Iterable[str] | None) -> None:
    ln = existing(rt)
    if ln is not None:
        ln.before_io(targets)


_runtime.before_io = _before_io

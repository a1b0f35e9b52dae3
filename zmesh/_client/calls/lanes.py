"""The sync path without hops: a thread with no event loop calls procs itself.

From plain code, a call normally goes to the runtime's I/O thread and its
reply comes back through it: two thread hops (a wake-up each) per call. A
*lane* is one thread's own DEALER per proc, driven by that thread: a sync
``call_one`` encodes and sends on it at once, and ``.get()`` is a blocking
``recv`` on it. No other thread is woken. (A blocking ``recv`` costs about
half the CPU of ``zmq_poll`` then ``recv``, measured.)

The common call (one actor, scalar arguments, no keywords) takes
``call_one`` below straight from the adverb: one function encodes the
message and sends it, and the ``SyncCall`` it returns is the user's future
itself. A reply is received as bytes (a ``zmq.Frame`` costs more) and
decoded in the same function that received it. Per call the lane allocates
the message, the future and the reply's value, and touches two dicts of its
own; nothing is created per call in the runtime's structures.

What the lane cannot do it leaves to the I/O thread (the *I/O path*): a first
call to a proc (the runtime must connect to it and follow its supervision),
a proc that is broken or released, buffers, a full in-flight window, and
every other adverb. The guarantees stay those of the I/O path:

* **Failures.** A lane registers with its runtime (``Runtime.lanes``) when
  it opens its first socket, and every call is in the lane's ``calls``
  before it is sent. Supervision runs on the I/O thread; when it breaks a
  proc's connection it asks each lane for its calls to that proc
  (``Lane.calls_to``) and fails them too (``SyncCall.settle``). The caller's
  ``recv`` gives up every ``SLICE_MS`` to look, so a killed proc fails
  ``.get()`` with ``SupervisionError`` at most that much later than on the
  I/O path. A dropped connection fails them after the same grace
  (``ConnectionLostError``); a per-call timeout is kept by the wait.
* **Order per caller.** A thread's messages to one proc must arrive in the
  order it sent them, but a lane and the runtime's socket are two
  connections. So (1) before the thread sends anything on the I/O path
  (``before_io``), it waits for the replies of its lane calls to those
  procs; and (2) a call goes on the lane only when every earlier I/O-path
  message of the thread to that proc is known to have arrived: the thread's
  last I/O-path message to it was a ``call_one`` that was answered.
* **Fork.** A forked child does not inherit the lane: it makes its own, and
  a call the parent had in flight on it fails in the child at once (its
  reply goes to the parent).
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import zmq

from zmesh._client.calls import runtime as _runtime
from zmesh._client.calls.connections import MAX_IN_FLIGHT
from zmesh._client.calls.future import Future
from zmesh._client.calls.grouping import SEP, ActorSink
from zmesh._client.calls.inflight import (
    CallSpec,
    abandon,
    ahead_of,
    hint,
    outcome,
    timeout_error,
)
from zmesh._client.calls.runtime import ProcRef
from zmesh._client.calls.synccall import SLICE_MS, SyncCall
from zmesh._errors import ActorError, ConnectionLostError, EncodeError
from zmesh._wire import messages as w
from zmesh._wire.codec import BATCH_MARK, BIG_BUFFER, MAX_MSG_SIZE, Codec
from zmesh._wire.deadlines import CLOCK, SPENT
from zmesh._wire.security import secure_client
from zmesh._wire.zsock import configure

if TYPE_CHECKING:
    from collections.abc import Iterable

    from zmesh._client.calls.runtime import Runtime
    from zmesh._client.handles.adverbs import EndpointRef

_NOBLOCK = int(zmq.NOBLOCK)
_RCVTIMEO = int(zmq.RCVTIMEO)
_RCVMORE = int(zmq.RCVMORE)
# The Cython methods under pyzmq's Python wrappers (see zmesh._wire.zsock).
_send = zmq.backend.Socket.send
_recv = zmq.backend.Socket.recv
_monotonic = time.monotonic
_Call = w.Call
_Payload = w.Payload
_Reply = w.Reply
_SLICE_S = SLICE_MS / 1000
# Argument types that travel in the envelope as they are (Codec.pack's fast case).
_INLINE = frozenset((type(None), bool, int, float, str))


class Lane:
    """One thread's sockets to procs, and its calls in flight on them.

    Used by its thread; another thread waiting on one of its calls takes
    ``lock`` to drive the sockets for a moment (a ZeroMQ socket may change
    threads behind a lock). ``calls`` is also read (``calls_to``) and
    settled from the I/O thread: only with single dict operations.
    """

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.loop = rt.loop  # the fast path checks it is still the home loop
        self.thread = threading.get_ident()
        self.codec = Codec(w.CLIENT_INBOX)
        self.encode = self.codec.encode_envelope
        self.decode = self.codec.decode_envelope
        self.lock = threading.Lock()
        self.socks: dict[str, Any] = {}  # each with RCVTIMEO SLICE_MS, but in a shorter wait
        self.calls: dict[int, SyncCall] = {}
        # Calls given up on and not answered yet (zmesh._client.calls.cancels).
        self.abandoned: dict[int, tuple[str, float]] = {}
        self._ids = itertools.count(1)
        # Order with the I/O path (see the module docstring): the sequence
        # number of the thread's last I/O-path message to each proc (and to
        # procs unknown: ``io_all``), and of its last answered I/O call_one
        # (``proven``, written by the I/O thread). ``clear``: the procs for
        # which that was found to cover the first two, since the thread last
        # sent on the I/O path to them (only this thread changes it).
        self.io_seq = 0
        self.io_all = 0
        self.io_to: dict[str, int] = {}
        self.proven: dict[str, int] = {}
        self.clear: set[str] = set()

    # ------------------------------------------------------------ sending

    def submit(self, ref: ProcRef, spec: CallSpec) -> Future[Any]:
        """The transport's ``submit`` for this thread (``zmesh._client.calls.transport``):
        on the lane, or else through the runtime's I/O thread, in call order.

        ``spec`` is addressed already (to ``name#k`` for one actor of a group).

        Raises:
            EncodeError: the message is over the size limit.
        """
        if not spec.buffers and spec.block:
            call = self.call(ref, spec)
            if call is not None:
                return call
        # The I/O path: one callback on the runtime's loop, scheduled in call
        # order like every other adverb (see Runtime.dispatch).
        rt = self.rt
        seq = self.before_io((ref.addr,))
        cfut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        cfut.add_done_callback(functools.partial(self.answered, ref.addr, seq))
        sink: Any = cfut if ref.index < 0 else ActorSink(cfut, ref)
        rt.dispatch(rt.call_threadsafe, ref, spec, sink, here=False, targets=())
        withdraw = functools.partial(rt.withdraw_threadsafe, sink, ref.addr)
        return Future(cfut=cfut, about=(ref, spec.method), withdraw=withdraw)

    def call(self, ref: ProcRef, spec: CallSpec) -> SyncCall | None:
        """Send ``spec`` (no buffers) on the lane; ``None``: it must take the I/O path.

        Raises:
            EncodeError: the message is over the size limit.
        """
        addr = ref.addr
        rt = self.rt
        c = rt.conns.get(addr)
        calls = self.calls
        if c is None or c.mesh != ref.mesh or c.broken is not None or len(calls) >= MAX_IN_FLIGHT:
            return None
        if addr not in self.clear:
            proven = self.proven.get(addr, -1)
            if proven < self.io_all or proven < self.io_to.get(addr, 0):
                return None
            self.clear.add(addr)
        req_id = next(self._ids)
        actor, method, timeout = spec.actor, spec.method, spec.timeout
        # The budget, not a clock reading (zmesh._wire.deadlines): sent right now.
        left = (timeout if timeout > SPENT else SPENT) if timeout is not None else 0.0
        msg = _Call(req_id, actor, method, spec.payload, left, sent=_monotonic(), clock=CLOCK)
        env = self.encode(msg)
        if len(env) > MAX_MSG_SIZE:
            try:  # the codec says what is wrong
                self.codec.encode(msg)
            except EncodeError as exc:
                raise EncodeError(
                    f"arguments of {method!r} cannot be sent: {exc.message}", **c.context()
                ) from exc
        call = SyncCall(self, ref, req_id, method, timeout, actor)
        # In ``calls`` before the check: a break from now on fails it; one
        # before shows in the connection (broken is set before calls fail).
        calls[req_id] = call
        if rt.conns.get(addr) is not c or c.broken is not None:
            call.settle(False, None)  # unregister; the I/O path says why
            return None
        with self.lock:
            sock = self.socks.get(addr)
            if sock is None:
                sock = self._connect(addr)
            _send(sock, env, _NOBLOCK)  # the HWM is far above MAX_IN_FLIGHT
        return call

    def _connect(self, addr: str) -> Any:
        sock = secure_client(
            configure(zmq.Context.instance().socket(zmq.DEALER), data=True), addr=addr
        )
        sock.setsockopt(zmq.RCVTIMEO, SLICE_MS)
        sock.connect(addr)
        if not self.socks:  # the first socket: supervision may now ask for its calls
            rt = self.rt
            with rt.sync_lock:
                rt.lanes.add(self)
        self.socks[addr] = sock
        return sock

    def calls_to(self, addr: str, mesh: str) -> list[SyncCall]:
        """The calls in flight on the lane to ``mesh``'s proc at ``addr`` (any thread)."""
        # list() of the values is one C call, atomic under the GIL, while
        # the lane's thread adds and removes calls.
        calls = list(self.calls.values())
        return [k for k in calls if k.ref.addr == addr and k.ref.mesh == mesh]

    # ------------------------------------------------------------ waiting

    def wait(self, call: SyncCall, timeout: float | None) -> None:
        """Drive the lane until ``call`` is settled, ``timeout`` passes, or it expires."""
        now = _monotonic()
        until = now + timeout if timeout is not None else None
        sock = self.socks.get(call.ref.addr)
        if sock is None:  # pragma: no cover - a lane call has its socket
            return
        lock = self.lock
        while not call.settled:
            expires = call.expires
            if expires and now >= expires:
                assert call.timeout is not None
                ahead = ahead_of(self.calls, call.id)
                why = hint(self.abandoned, ahead)
                if self.calls.get(call.id) is call:
                    abandon(self.abandoned, call.id, "timed out")
                call.settle(False, timeout_error(call.ref, call.timeout, why))
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
                if not call.settled:
                    self._receive(sock, ms)
            finally:
                lock.release()
            now = _monotonic()
            if until is not None and now >= until:
                return

    def _receive(self, sock: Any, ms: int) -> None:
        """Wait up to ``ms`` for a message on ``sock`` (0: do not wait); settle
        its calls. The lock is held."""
        try:
            if ms == SLICE_MS:  # the socket's RCVTIMEO
                env = _recv(sock, 0)
            elif ms <= 0:
                env = _recv(sock, _NOBLOCK)
            else:
                sock.setsockopt(_RCVTIMEO, ms)
                try:
                    env = _recv(sock, 0)
                finally:
                    sock.setsockopt(_RCVTIMEO, SLICE_MS)
        except zmq.Again:
            return
        # Received as bytes: whether frames follow is read from the message
        # itself (a zmq.Frame's ``more`` costs a Frame per reply, measured).
        # A message that decodes alone and needs no buffer frame had none:
        # the proc sends ``[envelope, *buffers]`` with each buffer referred
        # to (an Ext, or ``nbuf``); a batch has none. Anything else asks the socket.
        if not env:
            pass
        elif env[0] == BATCH_MARK:
            self._on_reply([env])
            return
        else:
            try:
                msg = self.decode(env)
            except Exception:  # a reference to a buffer frame, or garbled
                msg = None
            else:
                if type(msg) is _Reply and msg.payload.blob is None:
                    call = self.calls.get(msg.id)
                    if call is not None:  # the usual reply, settled right here
                        call.settle(True, msg.payload.args[0])
                    elif self.abandoned:  # a call given up on has ended
                        self.abandoned.pop(msg.id, None)
                    return
                if type(msg) is not _Reply or not msg.payload.nbuf:  # a Failure, a pickled value
                    call = self.calls.get(msg.id)
                    if call is not None:
                        call.settle(*outcome(self.codec, msg, [env], call.ref))
                    elif self.abandoned:
                        self.abandoned.pop(msg.id, None)
                    return
        frames: list[Any] = [env]
        while sock.get(_RCVMORE):
            frames.append(_recv(sock, _NOBLOCK, False))
        self._on_reply(frames)

    def _on_reply(self, frames: list[Any]) -> None:
        try:
            msgs = self.codec.decode_frames(frames)
        except Exception:  # garbled: dropped; its call times out or fails
            return
        for msg in msgs:
            call = self.calls.get(msg.id)
            if call is not None:
                call.settle(*outcome(self.codec, msg, frames, call.ref))
            elif self.abandoned:
                self.abandoned.pop(msg.id, None)

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
            self.clear.clear()
        else:
            for addr in addrs:
                self.io_to[addr] = self.io_seq
            self.clear -= addrs
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


# ---------------------------------------------------------------- the fast path


def call_one(ep: EndpointRef[Any], ref: ProcRef, args: tuple[Any, ...]) -> SyncCall | None:
    """``ep.call_one(*args)`` to ``ref`` from a thread with no loop, on its lane.

    The common case only: scalar (or small ``bytes``) arguments, a lane made
    already for the home runtime. ``None``: take the general path
    (``EndpointRef._send``), which also makes the lane.
    """
    ln: Lane | None = getattr(_local, "lane", None)
    if ln is None or ln.loop is not _runtime.home_loop():
        return None
    for v in args:
        t = type(v)
        if t not in _INLINE and (t is not bytes or len(v) >= BIG_BUFFER):
            return None
    actor = ep._mesh.actor
    if ref.index >= 0:  # one of several actors of its proc: addressed to it
        actor = f"{actor}{SEP}{ref.index}"
    timeout = ep._timeout
    deadline = _monotonic() + timeout if timeout is not None else 0.0
    call = ln.call(ref, CallSpec(actor, ep._name, _Payload(args), [], deadline, timeout))
    if call is not None:
        call._mesh = ep._mesh
    return call


# ---------------------------------------------------------------- per thread

_local = _runtime.thread_lanes  # the runtime tells a thread's lane before it sends


def _forget_after_fork() -> None:
    # In a forked child the lane of the thread that forked is the parent's:
    # its sockets are neither used nor closed there, and the replies of its
    # calls go to the parent. (A hook, not a pid test per call: getpid is a
    # system call.) The child has one thread: no lock is taken.
    ln: Lane | None = getattr(_local, "lane", None)
    if ln is not None:
        for call in ln.calls.values():
            ref = call.ref
            call.ok, call.settled = False, True
            call.value = ConnectionLostError(
                "the call was sent before this process forked: its reply goes to the parent",
                reason="forked", mesh=ref.mesh, rank=ref.rank, host=ref.host,
                log_path=ref.log_path or None,
            )  # fmt: skip
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

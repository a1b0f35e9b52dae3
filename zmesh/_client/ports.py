"""Ports and channels, with Monarch's names and semantics.

``Channel.open()`` makes a ``(Port, PortReceiver)`` pair. The port is a
value: pass it to any actor (as an argument, inside other values, through
other actors) and ``port.send(value)`` from there; ``await receiver.recv()``
(or ``receiver.recv().get()``) where the channel was opened. Values from one
sender arrive in the order it sent them. ``Channel.open(once=True)`` makes a
port that takes one value: a second ``send`` raises. ``Channel.open_ranked()``
makes a receiver whose values come as ``(rank, value)``, the sender's rank.

How it travels: the process that opens a channel (a client, or an actor's
proc) binds one ROUTER for all its receivers, lazily, an ipc:// socket in the
user's private runtime directory, and a port is that address plus a number.
In a multi-host run it also binds a TCP inbox (CURVE, and a ZAP handler
that admits only the keys the agents admit: ``zmesh._client.portserver``),
and the port carries that address, the inbox's public key and which host it
is on: a sender on the same host uses the ipc:// address, one on another
host the TCP one. A sender keeps one DEALER per receiving process (so one
sender's values stay in order) and never waits on it: a value for a receiver
that is gone, or one the socket cannot take now, is dropped and logged once.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import zmq

from zmesh._actor import current_point
from zmesh._client import portserver as _portserver
from zmesh._client import runtime as _runtime
from zmesh._client.adverbs import on_runtime
from zmesh._client.future import Future
from zmesh._client.inflight import Sink, resolve
from zmesh._client.runtime import Runtime
from zmesh._errors import EncodeError
from zmesh._shared import paths as _paths
from zmesh._wire import messages as w
from zmesh._wire import pickling as _pickling
from zmesh._wire import security as _security
from zmesh._wire.codec import Codec
from zmesh._wire.zsock import AsyncSocket, configure

if TYPE_CHECKING:
    from zmesh._client.adverbs import EndpointRef

log = logging.getLogger("zmesh.ports")

R = TypeVar("R")

PORT_HWM = 10_000  # values queued to one receiving process, at most, before sends drop
_numbers = itertools.count(1)


class Port(Generic[R]):
    """Where values for a ``PortReceiver`` go. A plain value: it pickles, and
    works from any actor, on any host of the run (``Channel.open`` makes one).

    Attributes:
        addr: the receiving process's ipc:// inbox (senders on its host).
        tcp: its TCP inbox (senders on other hosts), ``""`` on one host.
        key: the TCP inbox's CURVE public key, ``b""`` without keys.
        host: the receiving process's ``portserver.host_id()``.
    """

    __slots__ = ("addr", "host", "key", "number", "once", "sent", "tcp")

    def __init__(
        self, addr: str, number: int, once: bool = False, tcp: str = "", key: bytes = b"",
        host: str = "",
    ) -> None:  # fmt: skip
        self.addr = addr
        self.number = number
        self.once = once
        self.sent = False
        self.tcp = tcp
        self.key = key
        self.host = host

    def send(self, value: R) -> None:
        """Send ``value`` to the receiver; never blocks.

        Raises:
            ValueError: the port was opened with ``once=True`` and has sent already.
            EncodeError: ``value`` cannot be sent.
        """
        if self.once:
            if self.sent:
                raise ValueError("this port was opened with once=True and has sent its value")
            self.sent = True
        try:
            payload, buffers = Codec.pack_value(value)
        except Exception as exc:
            raise EncodeError(f"a port value cannot be sent: {type(exc).__name__}: {exc}") from exc
        point = current_point()
        self._send(payload, buffers, point.rank if point is not None else -1)

    def _send(self, payload: w.Payload, buffers: list[Any], rank: int) -> None:
        msg = w.PortSend(self.number, rank, payload)
        rt, home = _runtime.current()
        addr, key = self.route()
        rt.dispatch(_senders(rt).send, addr, msg, buffers, key, here=home, targets=())

    def route(self) -> tuple[str, bytes]:
        """Where a value sent from this process goes: ``(address, server key)``.

        The ipc:// inbox from the receiver's host, else its TCP inbox (``""``
        if it has none: the receiver was opened on one host only).
        """
        if not self.host or self.host == _host():
            return self.addr, b""
        return self.tcp, self.key

    def exception(self, exc: BaseException) -> None:
        """Send an exception: the receiver's ``recv()`` raises it.

        One that cannot be raised there as it is (a ``StopIteration``, which
        a future refuses, or one that does not unpickle) arrives as an
        ``EncodeError`` naming it.

        Raises:
            TypeError: ``exc`` is not an exception.
        """
        if not isinstance(exc, BaseException):
            raise TypeError(f"Port.exception takes an exception, not {type(exc).__name__}")
        self.send(_PortError(_raisable(exc)))  # type: ignore[arg-type]

    def __reduce__(self) -> Any:
        return (Port, (self.addr, self.number, self.once, self.tcp, self.key, self.host))

    def __repr__(self) -> str:
        return f"<zmesh.Port {self.number}{' once' if self.once else ''}>"


class _PortError:
    """An exception sent through a port (``Port.exception``)."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _raisable(exc: BaseException) -> BaseException:
    """``exc`` if a receiver can raise it as it is, else an ``EncodeError`` saying what it was."""
    if isinstance(exc, StopIteration):
        why = "a future cannot raise StopIteration"
    else:
        try:
            blob, buffers = _pickling.dumps(exc, lambda _buf: True)
            pickle.loads(blob, buffers=buffers)
            return exc
        except Exception as err:  # what the receiver would meet when unpickling it
            why = f"it does not travel: {type(err).__name__}: {err}"
    return EncodeError(f"a port was sent {type(exc).__name__}({exc}), which {why}")


class PortReceiver(Generic[R]):
    """The receiving end of a channel: ``await receiver.recv()`` or ``.recv().get()``."""

    def __init__(self, rt: Runtime, number: int, once: bool, ranked: bool) -> None:
        self._rt = rt
        self._number = number
        self._once = once
        self._ranked = ranked
        self._values: deque[tuple[int, Any]] = deque()  # arrived, not received yet
        self._waiters: deque[Sink] = deque()
        self._got = 0
        # Set by the adverbs of explicit-response-port endpoints: values go
        # straight to it (on the runtime's loop) instead of the queue.
        self._listener: Callable[[int, Any], None] | None = None

    def recv(self) -> Future[R]:
        """The next value, in arrival order (``(rank, value)`` for a ranked channel)."""

        def start(rt: Runtime, fut: Sink) -> None:
            if self._values:
                self._settle(fut, *self._values.popleft())
            else:
                self._waiters.append(fut)

        return on_runtime(start)

    def _deliver(self, rank: int, value: Any) -> None:
        """A value arrived (on the runtime's loop)."""
        if self._once and self._got:
            log.warning("a once port got a second value; dropped")
            return
        self._got += 1
        if self._listener is not None:
            self._listener(rank, value)
            return
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                self._settle(fut, rank, value)
                return
        self._values.append((rank, value))

    def _settle(self, fut: Sink, rank: int, value: Any) -> None:
        if isinstance(value, _PortError):
            exc = value.exc
            if not isinstance(exc, BaseException) or isinstance(exc, StopIteration):
                exc = EncodeError(f"a port was sent {exc!r} as an exception")  # (a forged one)
            resolve(fut, False, exc)
        else:
            resolve(fut, True, (rank, value) if self._ranked else value)

    def close(self) -> None:
        """Stop receiving: later values for this port are dropped (and logged once)."""
        self._rt.loop.call_soon_threadsafe(_server(self._rt).forget, self._number)

    def __repr__(self) -> str:
        return f"<zmesh.PortReceiver {self._number}>"


class Channel(Generic[R]):
    """Monarch's ``Channel``: ``Channel.open()`` makes a connected port and receiver."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port[Any], PortReceiver[Any]]:
        """A new ``(Port, PortReceiver)`` pair, received in this process.

        Args:
            once: the port takes one value; a second ``send`` raises.
        """
        return _open(once, ranked=False)

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[Port[Any], PortReceiver[tuple[int, Any]]]:
        """As ``open``, but ``recv()`` gives ``(rank, value)``: the rank of the
        actor that sent it (``-1`` for a sender that is no actor)."""
        return _open(once, ranked=True)


def _open(once: bool, ranked: bool) -> tuple[Port[Any], PortReceiver[Any]]:
    rt, home = _runtime.current()
    number = next(_numbers)
    receiver: PortReceiver[Any] = PortReceiver(rt, number, once, ranked)
    if home:
        server = _server(rt).add(receiver)
    else:
        server = on_runtime(lambda rt, fut: fut.set_result(_server(rt).add(receiver))).get(10)
    tcp, key = (server.tcp.addr, server.tcp.key) if server.tcp is not None else ("", b"")
    return Port(server.addr, number, once, tcp, key, _host()), receiver


_host_id: str | None = None


def _host() -> str:
    global _host_id
    if _host_id is None:
        _host_id = _portserver.host_id()
    return _host_id


# ------------------------------------------------------------ the sockets


class _Server:
    """The ROUTER of one runtime that receives every port value sent to it."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.codec = Codec(w.PORT_INBOX)
        self.receivers: weakref.WeakValueDictionary[int, PortReceiver[Any]] = (
            weakref.WeakValueDictionary()
        )
        self.dropped: set[int] = set()  # ports whose lost values were logged
        # Receivers kept alive while an adverb waits on them (nobody else holds them).
        self.pinned: dict[int, PortReceiver[Any]] = {}
        self.path = os.path.join(_paths.runtime_dir(), f"p{os.getpid()}-{id(rt):x}")
        sock = configure(rt.ctx.socket(zmq.ROUTER))
        sock.bind(f"ipc://{self.path}")
        os.chmod(self.path, 0o600)
        self.addr = f"ipc://{self.path}"
        self.sock = AsyncSocket(sock, rt.loop, self._on_message, router=True)
        # Other hosts' senders, in a multi-host run: bound with the first channel
        # opened once this process reaches agents on other hosts.
        self.tcp: _portserver.TcpInbox | None = None

    def add(self, receiver: PortReceiver[Any]) -> _Server:
        self.receivers[receiver._number] = receiver
        if self.tcp is None:
            ip = _portserver.reach_address()
            if ip is not None:
                self.tcp = _portserver.TcpInbox(ip, self.rt.loop, self._on_message)
        return self

    def forget(self, number: int) -> None:
        self.receivers.pop(number, None)
        self.pinned.pop(number, None)

    def _on_message(self, frames: list[Any]) -> None:
        try:
            msg = self.codec.decode(frames[1:])
            value = self.codec.unpack_value(msg.payload, frames[1:])
        except Exception as exc:  # never fatal: a garbled value is dropped
            log.warning("dropped a port value that does not decode: %r", exc)
            return
        receiver = self.receivers.get(msg.port)
        if receiver is None:
            if msg.port not in self.dropped:
                self.dropped.add(msg.port)
                log.warning("port %d has no receiver anymore: its values are dropped", msg.port)
            return
        receiver._deliver(msg.rank, value)

    def close(self) -> None:
        self.sock.close()
        if self.tcp is not None:
            self.tcp.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


class _Senders:
    """One DEALER per receiving process, for the port values this runtime sends."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.codec = Codec(w.PORT_INBOX)
        self.socks: dict[str, Any] = {}
        self.warned: set[str] = set()

    def send(self, addr: str, msg: w.PortSend, buffers: list[Any], key: bytes = b"") -> None:
        sock = self.socks.get(addr)
        if sock is None:
            if not addr or not self._can_reach(addr, key):
                return
            sock = configure(self.rt.ctx.socket(zmq.DEALER))
            sock.setsockopt(zmq.SNDHWM, PORT_HWM)
            _portserver.secure_sender(sock, key)
            sock.connect(addr)
            self.socks[addr] = sock
        try:
            frames = self.codec.encode(msg, buffers)
            sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:  # the receiver is gone, or far behind: never wait for it
            if addr not in self.warned:
                self.warned.add(addr)
                log.warning("port values to %s are dropped: its receiver is not reading", addr)
        except Exception as exc:
            log.error("a port value could not be sent: %r", exc)

    def _can_reach(self, addr: str, key: bytes) -> bool:
        """Whether a DEALER to ``addr`` can be made; else say why (once) and drop."""
        if addr and (not key or _security.active() is not None):
            return True
        why = addr or "ipc-only"
        if why not in self.warned:
            self.warned.add(why)
            if not addr:
                log.warning(
                    "port values are dropped: their receiver is on another host and has no TCP "
                    "inbox (it opened its channel in a run on one host)"
                )
            else:
                log.warning(
                    "port values to %s are dropped: it needs CURVE keys and this process has "
                    "none (ZMESH_KEYS)", addr,
                )  # fmt: skip
        return False

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close(linger=0)
        self.socks.clear()


_S = TypeVar("_S", _Server, _Senders)
_servers: weakref.WeakKeyDictionary[Runtime, _Server] = weakref.WeakKeyDictionary()
_sending: weakref.WeakKeyDictionary[Runtime, _Senders] = weakref.WeakKeyDictionary()


def _of_runtime(table: weakref.WeakKeyDictionary[Runtime, _S], make: type[_S], rt: Runtime) -> _S:
    """``rt``'s one ``make``, made on first use and closed with ``rt``."""
    s = table.get(rt)
    if s is None:
        s = table[rt] = make(rt)
        rt.closers.append(s.close)
    return s


def _server(rt: Runtime) -> _Server:
    return _of_runtime(_servers, _Server, rt)


def _senders(rt: Runtime) -> _Senders:
    return _of_runtime(_sending, _Senders, rt)


# ------------------------------------------------ adverbs and ``send``


def explicit_call(ep: EndpointRef[Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                  whole: bool) -> Future[Any]:  # fmt: skip
    """``call_one`` (or ``call``, with ``whole``) of an explicit-response-port endpoint.

    The endpoint gets a port first; its first value (per actor, for ``call``:
    a ``ValueMesh``) is the answer. The call itself is answered too (with
    the endpoint's return value, ignored), so an endpoint that raises, or a
    proc that dies before it answered, fails the future as for any call.
    """
    from zmesh._client.mesh import ValueMesh

    mesh = ep._mesh
    refs, points, dims = mesh._refs, mesh.points(), mesh.sizes
    port, receiver = _open(once=not whole, ranked=True)
    payload, buffers = ep._pack((port, *args), kwargs)
    msg = ep._call_msg(payload)

    def start(rt: Runtime, fut: Sink) -> None:
        server = _server(rt)
        server.pinned[receiver._number] = receiver
        results: dict[int, Any] = {}
        ranks = [p.rank for p in points]

        def settle(ok: bool, value: Any) -> None:
            server.forget(receiver._number)
            resolve(fut, ok, value)

        def on_value(rank: int, value: Any) -> None:
            if fut.done():
                return
            if isinstance(value, _PortError):
                settle(False, value.exc)
            elif not whole:
                settle(True, value)
            else:
                if rank not in ranks or rank in results:  # sent from outside the actor
                    rank = next(r for r in ranks if r not in results)
                results[rank] = value
                if len(results) == len(ranks):
                    settle(True, ValueMesh(dims, points, [results[r] for r in ranks]))

        def answered(i: int, ok: bool, value: Any) -> None:
            if not ok and not fut.done():
                settle(False, value)

        receiver._listener = on_value
        if not refs:
            settle(True, ValueMesh(dims, [], []))
            return
        rt.send(refs, msg, buffers, answered, ep._timeout, ep._block)

    return on_runtime(start, (mesh.proc_mesh, ep._name))


def send(
    endpoint: EndpointRef[Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    port: Port[Any] | None = None,
    selection: str = "all",
) -> None:
    """Monarch's ``send``: call ``endpoint`` and do not wait.

    Args:
        port: where the answers go: each actor's return value is sent to it
            (an explicit-response-port endpoint gets it as its first argument
            instead). ``None``: the answers are dropped.
        selection: ``"all"`` the actors of the endpoint's mesh, or
            ``"choose"`` one of them, the least loaded.
    """
    from zmesh._client.adverbs import least_loaded

    if selection not in ("all", "choose"):
        raise ValueError(f"selection must be 'all' or 'choose', not {selection!r}")
    kwargs = kwargs or {}
    explicit = endpoint._window < 0
    payload, buffers = endpoint._pack((port, *args) if explicit else args, kwargs)
    oneway = port is None or explicit
    msg = endpoint._call_msg(payload, oneway=oneway)
    refs = endpoint._mesh._refs

    def start(rt: Runtime) -> None:
        targets = [least_loaded(rt, refs)] if selection == "choose" and refs else refs
        deliver = None if oneway or port is None else _reply_to(port, targets)
        rt.send(targets, msg, buffers, deliver, endpoint._timeout, endpoint._block)

    rt, home = _runtime.current()
    rt.dispatch(start, rt, here=home, targets=[r.addr for r in refs])


def _reply_to(port: Port[Any], targets: list[Any]) -> Callable[[int, bool, Any], None]:
    """A ``deliver`` for ``Runtime.send`` that sends each answer on to ``port``,
    as from the rank that answered."""

    def deliver(i: int, ok: bool, value: Any) -> None:
        try:
            payload, buffers = Codec.pack_value(value if ok else _PortError(value))
        except Exception as exc:
            log.error("an answer for a port cannot be sent: %r", exc)
            return
        port._send(payload, buffers, targets[i].rank)

    return deliver

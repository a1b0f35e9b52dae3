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
that admits only the keys the agents admit: ``zmesh._client.ports.portserver``),
and the port carries that address, the inbox's public key and which host it
is on: a sender on the same host uses the ipc:// address, one on another
host the TCP one. A sender keeps one DEALER per receiving process (so one
sender's values stay in order) and never waits on it.

Bounded, and never silent: a receiver keeps at most ``PORT_MAX_VALUES``
unread values (``PORT_MAX_BYTES`` of them); past that a value is dropped,
counted (``receiver.statistics()``) and logged once, and its senders are
told: ``Port.send`` raises ``PortFullError`` until the reader catches up.
So it does when the receiving process has not read what was already sent
to it (gone, or stalled). See ``zmesh._client.ports.portsockets``.

The sockets are ``zmesh._client.ports.portsockets``'s; the calls answered through
ports (explicit-response-port endpoints, ``send``) ``zmesh._client.ports.portcalls``'s.
"""

from __future__ import annotations

import itertools
import logging
import pickle
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec

from zmesh._actor import current_point, own_proc
from zmesh._client.calls import runtime as _runtime
from zmesh._client.calls.future import Future
from zmesh._client.calls.inflight import Sink, resolve
from zmesh._client.calls.launch import on_runtime
from zmesh._client.calls.runtime import Runtime
from zmesh._client.ports import portserver as _portserver
from zmesh._client.ports import portsockets as _portsockets
from zmesh._client.ports.portsockets import _senders, _server
from zmesh._errors import EncodeError, PortFullError, encode_error
from zmesh._wire import messages as w
from zmesh._wire import pickling as _pickling
from zmesh._wire.codec import Codec

log = logging.getLogger("zmesh.ports")

R = TypeVar("R")

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

    __slots__ = ("addr", "guard", "host", "key", "number", "once", "response", "sent", "tcp")

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
        # An explicit response port in the proc of the endpoint it answers for
        # watches its sends and its drop there (zmesh._host.proc.responseport).
        self.guard: Any = None
        self.response = False  # a response port handed on: it says where it goes (_handed_on)

    def send(self, value: R) -> None:
        """Send ``value`` to the receiver; never blocks.

        Raises:
            ValueError: the port was opened with ``once=True`` and has sent already.
            ResponsePortError: the response port of an endpoint has sent its answer already.
            EncodeError: ``value`` cannot be sent.
            PortFullError: the receiver is not keeping up: it holds its bound
                of unread values, or its process has not read what this
                process sent it already. Nothing was sent; retry later.
        """
        guard = self.guard
        if self.once and self.sent and guard is None:
            raise ValueError("this port was opened with once=True and has sent its value")
        try:
            payload, buffers = Codec.pack_value(value)
        except Exception as exc:
            raise encode_error(
                f"a port value cannot be sent: {type(exc).__name__}: {exc}", exc
            ) from exc
        if guard is not None and guard.sent:
            guard.sending()  # raises: a response port answers once
        rt, home = _runtime.current()
        addr, key = self.route()
        nbytes = _portsockets.estimate(payload, buffers)
        why = _senders(rt).admit(addr, self.number, nbytes) if addr else ""
        if why:
            _portsockets._totals["refused"] += 1
            raise PortFullError(
                f"port {self.number}: {why} ("
                + ("its receiver holds its bound of unread values"
                   if why == "receiver full"
                   else "its process has not read what this process sent it")
                + "); the value was not sent",
                port=self.number, reason=why,
            )  # fmt: skip
        if guard is not None:
            guard.sending()  # the answer goes now (admitted: it is sent)
        self.sent = True
        point = current_point()
        msg = w.PortSend(self.number, point.rank if point is not None else -1, payload)
        rt.dispatch(_senders(rt).send, addr, msg, buffers, key, nbytes, here=home, targets=())

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

    def __del__(self) -> None:
        if self.guard is not None:  # (a response port: dropped unsent, its caller is told)
            self.guard.port_gone()

    def __reduce__(self) -> Any:
        where = (self.addr, self.number, self.once, self.tcp, self.key, self.host)
        if self.guard is not None:
            self.guard.handed_on()  # the copy answers now, wherever it goes
            return (_handed_on, where)
        return (_handed_on, where) if self.response else (Port, where)

    def __repr__(self) -> str:
        return f"<zmesh.Port {self.number}{' once' if self.once else ''}>"


class _PortError:
    """An exception sent through a port (``Port.exception``)."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _PortHeld:
    """A note to a response port's receiver: the proc at ``ref`` holds the port now.

    An endpoint may hand its response port on (in a call to another actor)
    and return; the caller then waits on a process it never called. Where
    the port is unpickled in a proc, that proc says so, and the caller
    watches it as it watches the procs it calls: if it dies before the
    answer comes, the call fails (``zmesh._client.ports.portcalls``).
    """

    port_note = True  # not a value (``portsockets`` drops a late one quietly)

    def __init__(self, ref: Any) -> None:
        self.ref = ref


_announced: dict[tuple[str, int], None] = {}  # (receiver, port) this proc said it holds
ANNOUNCED_MAX = 10_000


def _handed_on(addr: str, number: int, once: bool, tcp: str, key: bytes, host: str) -> Port[Any]:
    """A response port, unpickled where it was handed on: it tells its receiver
    that this proc holds it (once per port and proc)."""
    port: Port[Any] = Port(addr, number, once, tcp, key, host)
    port.response = True
    ref = own_proc()
    if ref is None or not ref.agent or (addr, number) in _announced:
        return port  # a client, or a client's own proc server: no agent watches it
    if len(_announced) >= ANNOUNCED_MAX:
        _announced.pop(next(iter(_announced)))
    _announced[addr, number] = None
    try:
        payload, buffers = Codec.pack_value(_PortHeld(ref))
        port._send(payload, buffers, -1)
    except Exception:  # the note is a safeguard: the port itself still works
        log.exception("cannot tell port %d's receiver that this proc holds it", number)
    return port


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


class PortStatistics(msgspec.Struct, frozen=True):
    """One ``PortReceiver``'s account (``receiver.statistics()``).

    Attributes:
        port: the port's number.
        received: values accepted (queued, or handed to a waiting ``recv``).
        queued: values waiting to be received now; ``queued_bytes`` their bytes.
        peak: the most values ever queued at once.
        dropped: values dropped because the receiver was full (see ``Port.send``).
        full: dropping now (senders are told) until the queue is down to half.
    """

    port: int
    received: int
    queued: int
    queued_bytes: int
    peak: int
    dropped: int
    full: bool


class PortReceiver(Generic[R]):
    """The receiving end of a channel: ``await receiver.recv()`` or ``.recv().get()``."""

    def __init__(self, rt: Runtime, number: int, once: bool, ranked: bool) -> None:
        self._rt = rt
        self._number = number
        self._once = once
        self._ranked = ranked
        self._values: deque[tuple[int, Any, int]] = deque()  # arrived, not received: +bytes
        self._bytes = 0  # of the values queued
        self._full = False  # dropping values (and senders were told) since the bound was met
        self._dropped = 0
        self._peak = 0
        self._waiters: deque[Sink] = deque()
        self._got = 0
        # Set by the adverbs of explicit-response-port endpoints: values go
        # straight to it (on the runtime's loop) instead of the queue.
        self._listener: Callable[[int, Any], None] | None = None
        self._on_held: Callable[[Any], None] | None = None  # ... and told where the port went

    def recv(self) -> Future[R]:
        """The next value, in arrival order (``(rank, value)`` for a ranked channel)."""

        def start(rt: Runtime, fut: Sink) -> None:
            if self._values:
                rank, value, nbytes = self._values.popleft()
                self._bytes -= nbytes
                if self._full and self._below_half():
                    self._full = False
                    _server(rt).drained(self._number)
                self._settle(fut, rank, value)
            else:
                self._waiters.append(fut)

        return on_runtime(start)

    def _deliver(self, rank: int, value: Any, nbytes: int = 0) -> bool:
        """A value of ``nbytes`` arrived (on the runtime's loop); ``False``: dropped, full."""
        if type(value) is _PortHeld:  # not a value: where the port went (_handed_on)
            if self._on_held is not None:
                self._on_held(value.ref)
            return True
        if self._once and self._got:
            log.warning("a once port got a second value; dropped")
            return True
        if self._listener is not None:
            self._got += 1
            self._listener(rank, value)
            return True
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                self._got += 1
                self._settle(fut, rank, value)
                return True
        if self._full or (
            self._values
            and (len(self._values) >= _portsockets.PORT_MAX_VALUES
                 or self._bytes + nbytes > _portsockets.PORT_MAX_BYTES)
        ):  # fmt: skip
            if not self._dropped:
                log.warning(
                    "port %d: its receiver holds %d unread values (%d bytes), its bound: "
                    "values are dropped and counted (statistics().dropped), and senders "
                    "get PortFullError until it reads", self._number, len(self._values),
                    self._bytes,
                )  # fmt: skip
            self._full = True
            self._dropped += 1
            return False
        self._got += 1
        self._values.append((rank, value, nbytes))
        self._bytes += nbytes
        if len(self._values) > self._peak:
            self._peak = len(self._values)
        return True

    def _below_half(self) -> bool:
        return (
            len(self._values) <= _portsockets.PORT_MAX_VALUES // 2
            and self._bytes <= _portsockets.PORT_MAX_BYTES // 2
        )

    def statistics(self) -> PortStatistics:
        """What this receiver got, holds and dropped, as a frozen record."""
        return PortStatistics(
            self._number, self._got, len(self._values), self._bytes, self._peak, self._dropped,
            self._full,
        )  # fmt: skip

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

"""The sockets of ports (``channels``): one inbox and one set of senders per runtime.

``_Server`` is the ROUTER (ipc://, plus a CURVE TCP inbox in a multi-host
run: ``zmesh._client.ports.portserver``) that receives every port value sent to
this runtime and hands it to its ``PortReceiver``. ``_Senders`` keeps one
DEALER per receiving process, so one sender's values stay in order, and
never waits on it. Both are made on first use and closed with their runtime.

Every queue on the way is bounded by count and by bytes, and nothing is
lost without a count (docs/streams.md, "Bounds"):

* A ``PortReceiver`` holds at most ``PORT_MAX_VALUES`` unread values and
  ``PORT_MAX_BYTES`` of them. A value past that is dropped and counted
  (``receiver.statistics().dropped``, and this process's
  ``dropped_values()``), the first drop of a receiver is logged, and the
  senders are told: the server acks back which of their ports are full,
  and ``Port.send`` then raises ``PortFullError`` until the reader catches
  up (to half the bound).
* The pipe from one sender to one receiving process (ZeroMQ's queues and
  the socket's own) holds what was sent and not yet read by the receiving
  process. ZeroMQ bounds it in messages only, so the sender keeps its own
  account: the server acks every ``ACK_VALUES`` values or ``ACK_BYTES``
  bytes it read from a connection, and past ``PIPE_MAX_VALUES`` values or
  ``PIPE_MAX_BYTES`` bytes unacked, ``Port.send`` raises ``PortFullError``
  (the receiving process is gone, or its loop is not reading).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, TypeVar

import zmq

from zmesh._client.calls.runtime import Runtime
from zmesh._client.ports import portserver as _portserver
from zmesh._shared import paths as _paths
from zmesh._wire import messages as w
from zmesh._wire import security as _security
from zmesh._wire.codec import Codec
from zmesh._wire.zsock import AsyncSocket, configure

if TYPE_CHECKING:
    from zmesh._client.ports.channels import PortReceiver

log = logging.getLogger("zmesh.ports")

PORT_MAX_VALUES = int(os.environ.get("ZMESH_PORT_MAX_VALUES", "10000"))  # unread, per receiver
PORT_MAX_BYTES = int(os.environ.get("ZMESH_PORT_MAX_BYTES", str(64 << 20)))  # and their bytes
PIPE_MAX_VALUES = 10_000  # sent to one receiving process and not read by it yet
PIPE_MAX_BYTES = 64 << 20  # and their bytes
ACK_VALUES = 1000  # the server acks a connection every this many values read,
ACK_BYTES = 1 << 20  # or this many bytes, whichever comes first
MAX_PEERS = 4096  # sender connections the server keeps accounts for, before settling them
PORT_HWM = PIPE_MAX_VALUES  # (the old name)

_totals = {"dropped": 0, "refused": 0}  # this process's, over every runtime


def dropped_values() -> int:
    """Port values this process received and dropped: their receiver was full."""
    return _totals["dropped"]


def refused_values() -> int:
    """``Port.send`` calls in this process refused with ``PortFullError``."""
    return _totals["refused"]


def size(frames: list[Any]) -> int:
    """The bytes of a message's frames (``bytes``, ``zmq.Frame`` or any buffer)."""
    return sum(memoryview(f).nbytes for f in frames)


class _Peer:
    """What the server owes one sender connection: acks, and full-port news."""

    __slots__ = ("full", "nbytes", "sock", "values")

    def __init__(self, sock: AsyncSocket) -> None:
        self.sock = sock  # the socket it came in on (ipc:// or TCP)
        self.values = 0  # read since the last ack
        self.nbytes = 0
        self.full: set[int] = set()  # its ports it was told are full


class _Server:
    """The ROUTER of one runtime that receives every port value sent to it."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.codec = Codec(w.PORT_INBOX)
        self.acks = Codec(w.PORT_ACKS)
        self.receivers: weakref.WeakValueDictionary[int, PortReceiver[Any]] = (
            weakref.WeakValueDictionary()
        )
        self.dropped: set[int] = set()  # ports whose lost values were logged
        self.peers: dict[bytes, _Peer] = {}  # sender connections, by ROUTER identity
        self.told: set[int] = set()  # ports some sender was told are full
        self.garbled = 0  # values that did not decode
        # Receivers kept alive while an adverb waits on them (nobody else holds them).
        self.pinned: dict[int, PortReceiver[Any]] = {}
        self.path = os.path.join(_paths.runtime_dir(), f"p{os.getpid()}-{id(rt):x}")
        sock = configure(rt.ctx.socket(zmq.ROUTER), addr=f"ipc://{self.path}")
        sock.bind(f"ipc://{self.path}")
        os.chmod(self.path, 0o600)
        self.addr = f"ipc://{self.path}"
        self.sock: AsyncSocket = AsyncSocket(
            sock, rt.loop, lambda frames: self._on_message(frames, self.sock), router=True
        )
        # Other hosts' senders, in a multi-host run: bound with the first channel
        # opened once this process reaches agents on other hosts.
        self.tcp: _portserver.TcpInbox | None = None

    def add(self, receiver: PortReceiver[Any]) -> _Server:
        self.receivers[receiver._number] = receiver
        if self.tcp is None:
            ip = _portserver.reach_address()
            if ip is not None:
                self.tcp = _portserver.TcpInbox(ip, self.rt.loop, self._on_tcp)
        return self

    def forget(self, number: int) -> None:
        self.receivers.pop(number, None)
        self.pinned.pop(number, None)
        self.drained(number)  # its values are dropped as for any receiver gone, not refused

    def _on_tcp(self, frames: list[Any]) -> None:
        assert self.tcp is not None
        self._on_message(frames, self.tcp.sock)

    def _on_message(self, frames: list[Any], sock: AsyncSocket) -> None:
        ident = frames[0]
        peer = self.peers.get(ident)
        if peer is None:
            if len(self.peers) >= MAX_PEERS:
                self._settle_peers()
            peer = self.peers[ident] = _Peer(sock)
        nbytes = size(frames[1:])
        peer.values += 1
        peer.nbytes += nbytes
        try:
            msg = self.codec.decode(frames[1:])
            value = self.codec.unpack_value(msg.payload, frames[1:])
        except Exception as exc:  # never fatal: a garbled value is counted, dropped
            self.garbled += 1
            if self.garbled == 1:  # logged once, not per message
                log.warning("dropped a port value that does not decode (counted): %r", exc)
            self._ack(ident, peer)
            return
        receiver = self.receivers.get(msg.port)
        if receiver is None:
            if getattr(value, "port_note", False):
                pass  # where a port went, told after its call ended: nothing lost
            elif msg.port not in self.dropped:
                self.dropped.add(msg.port)
                log.warning("port %d has no receiver anymore: its values are dropped", msg.port)
        elif not receiver._deliver(msg.rank, value, nbytes):
            _totals["dropped"] += 1
            if msg.port not in peer.full:
                peer.full.add(msg.port)
                self.told.add(msg.port)
                self._ack(ident, peer, force=True)  # tell the sender now
                return
        self._ack(ident, peer)

    def _ack(self, ident: bytes, peer: _Peer, force: bool = False) -> None:
        """Tell ``peer`` what was read from it, when due (or ``force``)."""
        if not force and peer.values < ACK_VALUES and peer.nbytes < ACK_BYTES:
            return
        ack = w.PortAck(peer.values, peer.nbytes, sorted(peer.full))
        peer.values = peer.nbytes = 0
        peer.sock.send([ident, *self.acks.encode(ack)])

    def _settle_peers(self) -> None:
        """Forget the sender connections told nothing is full, acking what they
        are owed first: the table stays bounded as senders come and go."""
        for ident, peer in list(self.peers.items()):
            if not peer.full:
                if peer.values:
                    self._ack(ident, peer, force=True)
                del self.peers[ident]

    def drained(self, port: int) -> None:
        """Port ``port``'s receiver has room again (or is gone): tell the senders
        told it was full."""
        if port not in self.told:
            return
        self.told.discard(port)
        for ident, peer in list(self.peers.items()):
            if port in peer.full:
                peer.full.discard(port)
                self._ack(ident, peer, force=True)

    def close(self) -> None:
        self.sock.close()
        if self.tcp is not None:
            self.tcp.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


class _Link:
    """One DEALER to one receiving process, and what was sent there and not read yet.

    The account is kept from ``Port.send`` on (in any thread, under ``lock``),
    not from when the loop sends: a thread sending faster than the loop
    drains its queue is held to the same bound.
    """

    __slots__ = ("full", "lock", "nbytes", "sock", "values")

    def __init__(self) -> None:
        self.sock: AsyncSocket | None = None  # made by the loop, on the first value
        self.lock = threading.Lock()
        self.values = 0  # accepted and not acked: queued here, in ZeroMQ, or unread there
        self.nbytes = 0
        self.full: frozenset[int] = frozenset()  # its ports whose receivers said they are full

    def refusal(self, port: int) -> str:
        """Why a value for ``port`` cannot go now, or ``""``."""
        if port in self.full:
            return "receiver full"
        if self.values >= PIPE_MAX_VALUES or self.nbytes >= PIPE_MAX_BYTES:
            return "receiver not reading"
        return ""

    def count(self, values: int, nbytes: int) -> None:
        with self.lock:
            self.values = max(0, self.values + values)
            self.nbytes = max(0, self.nbytes + nbytes)


def estimate(payload: w.Payload, buffers: list[Any]) -> int:
    """A port value's bytes before it is encoded (the loop corrects it after)."""
    n = 64 + size(buffers) + (len(payload.blob) if payload.blob is not None else 0)
    for arg in payload.args:
        if isinstance(arg, (bytes, str)):
            n += len(arg)
    return n


class _Senders:
    """One DEALER per receiving process, for the port values this runtime sends."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.codec = Codec(w.PORT_INBOX)
        self.acks = Codec(w.PORT_ACKS)
        self.links: dict[str, _Link] = {}
        self.warned: set[Any] = set()  # what was logged once

    def _link(self, addr: str) -> _Link:
        link = self.links.get(addr)
        if link is None:
            link = self.links.setdefault(addr, _Link())  # (atomic: any thread)
        return link

    def admit(self, addr: str, port: int, nbytes: int) -> str:
        """Account for a value of about ``nbytes`` for ``port`` at ``addr`` (any
        thread), or say why ``Port.send`` must refuse it now (``""``: admitted)."""
        link = self._link(addr)
        with link.lock:
            why = link.refusal(port)
            if not why:
                link.values += 1
                link.nbytes += nbytes
        if why and (addr, why) not in self.warned:
            self.warned.add((addr, why))  # once per receiving process and reason
            log.warning("port values to %s are refused (PortFullError): %s", addr, why)
        return why

    def send(
        self, addr: str, msg: w.PortSend, buffers: list[Any], key: bytes = b"",
        admitted: int = -1,
    ) -> None:  # fmt: skip
        """Send a value (on the loop). ``admitted``: the bytes ``admit`` counted
        for it; ``-1``: not admitted (answers of calls, bounded by the calls)."""
        if not addr:
            self._can_reach(addr, key)  # says why, once
            return
        link = self._link(addr)
        if link.sock is None and not self._can_reach(addr, key):
            if admitted >= 0:
                link.count(-1, -admitted)  # never sent
            return
        if link.sock is None:
            sock = configure(self.rt.ctx.socket(zmq.DEALER), addr=addr)
            sock.setsockopt(zmq.SNDHWM, PIPE_MAX_VALUES)
            _portserver.secure_sender(sock, key)
            sock.connect(addr)
            link.sock = AsyncSocket(sock, self.rt.loop, lambda f: self._on_ack(link, f))
        try:
            frames = self.codec.encode(msg, buffers)
        except Exception as exc:
            log.error("a port value could not be sent: %r", exc)
            if admitted >= 0:
                link.count(-1, -admitted)
            return
        if admitted >= 0:
            link.count(0, size(frames) - admitted)  # the exact size, now it is known
        else:
            link.count(1, size(frames))
        # AsyncSocket keeps what ZeroMQ cannot take now, in order: bounded by
        # the refusals above (Port.send admits first).
        link.sock.send(frames)

    def _on_ack(self, link: _Link, frames: list[Any]) -> None:
        try:
            ack = self.acks.decode(frames)
        except Exception as exc:  # never fatal; said once
            if "ack" not in self.warned:
                self.warned.add("ack")
                log.warning("dropped a port ack that does not decode: %r", exc)
            return
        link.count(-ack.values, -ack.nbytes)
        link.full = frozenset(ack.full)

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
        for link in self.links.values():
            if link.sock is not None:
                link.sock.close(linger=0)
        self.links.clear()


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

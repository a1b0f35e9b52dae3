"""The sockets of ports (``zmesh._client.ports``): one inbox and one set of senders per runtime.

``_Server`` is the ROUTER (ipc://, plus a CURVE TCP inbox in a multi-host
run: ``zmesh._client.portserver``) that receives every port value sent to
this runtime and hands it to its ``PortReceiver``. ``_Senders`` keeps one
DEALER per receiving process, so one sender's values stay in order, and
never waits on it: a value the socket cannot take now is dropped and
logged once. Both are made on first use and closed with their runtime.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import TYPE_CHECKING, Any, TypeVar

import zmq

from zmesh._client import portserver as _portserver
from zmesh._client.runtime import Runtime
from zmesh._shared import paths as _paths
from zmesh._wire import messages as w
from zmesh._wire import security as _security
from zmesh._wire.codec import Codec
from zmesh._wire.zsock import AsyncSocket, configure

if TYPE_CHECKING:
    from zmesh._client.ports import PortReceiver

log = logging.getLogger("zmesh.ports")

PORT_HWM = 10_000  # values queued to one receiving process, at most, before sends drop


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

"""The TCP side of ports: where values sent from other hosts arrive.

On one host a port is an ipc:// address in the user's private runtime
directory (``zmesh._client.ports.channels``). A port that travels to another host
(another machine, or another network or mount namespace, where that path
means nothing) needs a TCP address too, and TCP is secured like every
other socket zmesh binds (``zmesh._wire.security``):

* a CURVE server with this process's keys (the client's own keypair, or
  the agents' in a proc); the port carries the server's public key, so a
  sender can connect to it;
* a ZAP handler that admits only keys the agents admit: the agents' key
  (which procs use), our own, and the allow-list ``authorized/`` when this
  process holds the agents' directory. Without a handler a CURVE server
  would take any key. The handler runs on a ZeroMQ context of its own, so
  it never meets another handler of this process (one per context).

The inbox is bound only in a multi-host run (``reach_address``), on the
interface this process uses to reach its agents (a proc: the one its own
ROUTER is bound on), when the first channel is opened.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import zmq

from zmesh._actor import own_proc
from zmesh._client.control import local as _local
from zmesh._wire import security as _security
from zmesh._wire.zsock import AsyncSocket, configure

log = logging.getLogger("zmesh.ports")

_LOOPBACK = ("127.", "::1", "localhost")


def host_id() -> str:
    """Which host this process is on, as far as ipc:// is concerned.

    This boot of this kernel, in this network and mount namespace: a port
    whose receiver has another id is reached over TCP.
    """
    parts = []
    for path in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/net", "/proc/self/ns/mnt"):
        try:
            if path.startswith("/proc/self/ns/"):
                parts.append(os.readlink(path))
            else:
                with open(path) as f:
                    parts.append(f.read().strip())
        except OSError:
            parts.append(socket.gethostname())
    return "/".join(parts)


def _tcp_host(addr: str) -> str | None:
    """The host of a ``tcp://HOST:PORT`` address that is not loopback, else ``None``."""
    if not addr.startswith("tcp://"):
        return None
    host = urlsplit(addr).hostname or ""
    if not host or host.startswith(_LOOPBACK):
        return None
    return host


def reach_address() -> str | None:
    """The local IP that other hosts reach this process at, or ``None`` on one host.

    A proc: the IP its own ROUTER is bound on (its agent's interface). A
    client: the source address of the route to its first remote agent (a
    UDP ``connect`` only asks the kernel for the route; nothing is sent).
    """

    mine = own_proc()
    if mine is not None:
        host = _tcp_host(mine.addr)
        if host is not None and host not in ("0.0.0.0", "::"):
            return host
        if host is None:
            return None
    for agent in _local.configured_agents() or []:
        host = _tcp_host(agent)
        if host is None:
            continue
        port = urlsplit(agent).port or 1
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect((host, port))
                return str(probe.getsockname()[0])
        except OSError as exc:  # no route: the agent is unreachable anyway
            log.debug("no route to %s: %r", agent, exc)
    return None


class _Admitted:
    """The ZAP callback: a sender's key is admitted if the agents admit it."""

    def __init__(self, keys: _security.Keys) -> None:
        self.keys = keys
        self.fixed = {keys.server, keys.public}
        self.listed: set[bytes] = set()
        self.stamp = -1
        self.lock = threading.Lock()

    def _refresh(self) -> None:
        try:
            stamp = os.stat(self.keys.authorized).st_mtime_ns
        except OSError:
            return  # a client's own directory has no allow-list
        if stamp == self.stamp:
            return
        listed = set()
        for name in os.listdir(self.keys.authorized):
            if name.endswith(".key"):
                try:
                    listed.add(_security.read_public(os.path.join(self.keys.authorized, name)))
                except Exception:  # one unreadable file does not close the door to the others
                    log.warning("cannot read the key file %s", name)
        self.listed, self.stamp = listed, stamp

    def callback(self, domain: str, key: bytes) -> bool:
        if domain != _security.DOMAIN:
            return False
        with self.lock:
            self._refresh()
            return key in self.fixed or key in self.listed


class _Context:
    """This process's context for TCP inboxes, with its ZAP handler."""

    def __init__(self, keys: _security.Keys | None) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        self.pid = os.getpid()
        self.keys = keys
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.auth: ThreadAuthenticator | None = None
        if keys is not None:
            self.auth = ThreadAuthenticator(self.ctx)
            self.auth.start()
            self.auth.configure_curve_callback(_security.DOMAIN, _Admitted(keys))


_lock = threading.Lock()
_shared: _Context | None = None


def _context() -> _Context:
    global _shared
    with _lock:
        keys = _security.active()
        if _shared is None or _shared.pid != os.getpid() or _shared.keys != keys:
            if _shared is not None and _shared.pid == os.getpid() and _shared.auth is not None:
                _shared.auth.stop()  # other keys now (a new connect): the old inboxes are closed
            _shared = _Context(keys)
        return _shared


class TcpInbox:
    """A ROUTER on ``tcp://IP:*`` (CURVE + ZAP when this process has keys).

    Attributes:
        addr: where senders on other hosts connect.
        key: the server's public key (z85), ``b""`` without keys.
    """

    def __init__(self, ip: str, loop: Any, on_message: Callable[[list[Any]], None]) -> None:
        shared = _context()
        keys = shared.keys
        if keys is None:
            log.warning(
                "port values from other hosts arrive on keyless TCP (this client has no keys; "
                "its agents run --insecure)"
            )
        sock = _security.secure_server(configure(shared.ctx.socket(zmq.ROUTER)), keys, "tcp://")
        host = f"[{ip}]" if ":" in ip else ip
        sock.bind(f"tcp://{host}:*")
        self.addr = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.key = keys.public if keys is not None else b""
        self.sock = AsyncSocket(sock, loop, on_message, router=True)

    def close(self) -> None:
        self.sock.close()


def secure_sender(sock: Any, key: bytes) -> bool:
    """Make ``sock`` a CURVE client of a port server whose public key is ``key``.

    Returns:
        whether it can connect: a keyed server needs keys of our own.
    """
    if not key:
        return True
    keys = _security.active()
    if keys is None:
        return False
    sock.setsockopt(zmq.CURVE_SERVERKEY, key)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
    return True

"""Serve a gateway with uvicorn: bind, say it is ready, stop cleanly on Ctrl+C or SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import signal
import socket
from collections.abc import Callable, Iterator
from typing import Any

from zmesh._errors import ZmeshError

try:
    import uvicorn
except ImportError:  # the core needs none of it: zmesh[http] brings it
    uvicorn = None  # type: ignore[assignment]

# Seconds open requests and streams get to finish once a stop is asked for.
GRACE = 2


def parse_bind(bind: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; a bare ``HOST`` is port 0) as ``(host, port)``.

    Raises:
        ValueError: not of that form, or a port out of range.
    """
    host, sep, port = bind.rpartition(":")
    if not sep or "]" in port:  # no port given
        host, port = bind, "0"
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{bind!r} is not HOST:PORT (port 0 picks a free one)")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def serve(app: Any, host: str, port: int, ready: Callable[[str], None]) -> None:
    """Serve ``app`` on ``host:port`` until Ctrl+C or SIGTERM; ``ready(url)`` once it listens.

    Raises:
        ZmeshError: uvicorn is not installed (``pip install 'zmesh[http]'``),
            or the address cannot be bound.
    """
    if uvicorn is None:
        raise ZmeshError("zmesh http needs uvicorn: pip install 'zmesh[http]'")
    try:
        sock = _bind(host, port)
    except OSError as exc:
        raise ZmeshError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    with sock:
        asyncio.run(_serve(app, sock, ready))


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP said out loud: asyncio sets TCP_NODELAY only on sockets that
    # say so, and without it a response's headers and body (two writes) meet
    # the client's delayed ACK: 40 ms per request on keep-alive.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


async def _serve(app: Any, sock: socket.socket, ready: Callable[[str], None]) -> None:
    config = uvicorn.Config(
        app, lifespan="off", log_level="warning", access_log=False,
        timeout_graceful_shutdown=GRACE,
    )  # fmt: skip
    server = _Server(config)
    with _stop_on_signals(server):
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            host, port = sock.getsockname()[:2]
            ready(f"http://{f'[{host}]' if ':' in host else host}:{port}")
        await task


class _Server(uvicorn.Server if uvicorn is not None else object):  # type: ignore[misc]
    def capture_signals(self) -> contextlib.AbstractContextManager[None]:
        # Ours are installed on the loop (_stop_on_signals): uvicorn's would
        # raise the signal again once it stopped, and SIGTERM would kill us
        # before the runtime's shutdown.
        return contextlib.nullcontext()


@contextlib.contextmanager
def _stop_on_signals(server: Any) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    hits = [0]

    def stop() -> None:
        hits[0] += 1
        server.should_exit = True
        if hits[0] > 1:  # a second Ctrl+C: do not wait for open streams
            server.force_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    try:
        yield
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)

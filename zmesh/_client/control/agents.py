"""The client side of the agent control protocol: one place that talks to agents.

An agent's control socket is a ROUTER. Whoever asks it something (the
runtime's controller, ``zmesh top``, a service reporting its replicas, the
owner heartbeat, the exit path) holds a DEALER to it and sends messages of
``zmesh._wire.messages.AGENT_INBOX``; a request carries an id, and its answer
(one of ``AGENT_REPLIES``) carries the same id. This module is that client,
written once:

* ``AgentClient``: async request/reply on an asyncio loop, for many requests
  in flight at once (replies matched by id), each with a timeout, and
  fire-and-forget ``send``.
* ``AgentLink``: the same over a blocking socket, for threads without a loop
  (the owner heartbeat, ``release_all`` at exit, a blocking state query).

Both are CURVE clients of the agents' key on tcp:// (``secure_client``), and
fail with typed errors: ``AgentTimeoutError`` (no answer in time; also a
``TimeoutError``), ``SecurityError`` (the agent refused: we are not the
owner), ``AgentError`` (it said no).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

import zmq

from zmesh._errors import AgentError, AgentTimeoutError, SecurityError
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec
from zmesh._wire.security import Keys, secure_client
from zmesh._wire.zsock import AsyncSocket, configure

# A request is built from its id: ``lambda i: w.GetState(i)``, ``w.Describe``,
# ``functools.partial(w.GetStack, mesh=m, rank=r)``.
MakeRequest = Callable[[int], Any]


def _check(reply: Any, label: str) -> Any:
    """``reply``, unless it is a refusal: then the error it stands for."""
    if isinstance(reply, w.Ack) and not reply.ok:
        if reply.denied:  # e.g. a Stop of a mesh we do not own
            raise SecurityError(reply.error, host=label)
        raise AgentError(reply.error, host=label)
    return reply


def _timeout(label: str, timeout: float) -> AgentTimeoutError:
    return AgentTimeoutError(f"agent {label} did not answer within {timeout}s", host=label)


class AgentClient:
    """Requests to one agent from one asyncio loop, over one DEALER.

    Create, use and close it on the loop's thread.

    Args:
        ctx: the ZeroMQ context.
        addr: the agent's control address.
        loop: the loop that owns the socket.
        allow_pickle: whether replies may carry pickled values (``False`` for
            observers such as ``zmesh top``).
        keys: the keys to reach it with (default: this process's, ``active()``).

    Attributes:
        label: the agent's name in errors (its address until told otherwise).
        last_reply: ``time.monotonic()`` of the last reply of any request
            (0: none yet); the controller tells a silent agent from a live one
            by it.
    """

    def __init__(
        self,
        ctx: zmq.Context[Any],
        addr: str,
        loop: asyncio.AbstractEventLoop,
        *,
        allow_pickle: bool = True,
        keys: Keys | None = None,
    ) -> None:
        self.addr = addr
        self.label = addr
        self.loop = loop
        self.last_reply = 0.0
        self._ids = itertools.count(1)
        self._futures: dict[int, asyncio.Future[Any]] = {}
        self._codec = Codec(w.AGENT_REPLIES, allow_pickle=allow_pickle)
        sock = secure_client(configure(ctx.socket(zmq.DEALER), addr=addr), keys, addr=addr)
        sock.connect(addr)
        self._sock = AsyncSocket(sock, loop, self._on_reply)

    async def request(self, make: MakeRequest, timeout: float = 5.0, *, check: bool = True) -> Any:
        """Send ``make(id)`` and return the agent's reply to it.

        Args:
            make: builds the request from its id.
            timeout: seconds to wait for the reply.
            check: raise for an ``Ack`` that says no (else return it).

        Raises:
            AgentTimeoutError: no reply within ``timeout``.
            SecurityError: the agent refused: we may not do this.
            AgentError: the agent said no (``check``).
        """
        req_id = next(self._ids)
        fut: asyncio.Future[Any] = self.loop.create_future()
        self._futures[req_id] = fut
        self._sock.send(self._codec.encode(make(req_id)))
        try:
            reply = await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise _timeout(self.label, timeout) from None
        finally:
            self._futures.pop(req_id, None)
        return _check(reply, self.label) if check else reply

    def send(self, msg: Any) -> None:
        """Send ``msg`` and expect no reply (e.g. ``ServiceReport``)."""
        self._sock.send(self._codec.encode(msg))

    def _on_reply(self, frames: list[Any]) -> None:
        try:
            msg = self._codec.decode(frames)
        except Exception:  # garbled, or of a newer agent: its request times out
            return
        self.last_reply = time.monotonic()
        fut = self._futures.get(msg.id)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def close(self) -> None:
        """Close the socket; requests still waiting time out."""
        self._sock.close()


class AgentLink:
    """A blocking DEALER to one agent, for a thread without an event loop.

    Not thread-safe: one thread uses it (ZeroMQ sockets are not shared).

    Args:
        addr: the agent's control address.
        ctx: the ZeroMQ context (default: the process's).
        sndhwm: messages queued for the agent at most; more are dropped by
            ``send`` (a backlog of heartbeats means nothing).
    """

    def __init__(
        self, addr: str, ctx: zmq.Context[Any] | None = None, *, sndhwm: int | None = None
    ) -> None:
        self.addr = addr
        self._ids = itertools.count(1)
        self._codec = Codec(w.AGENT_REPLIES)
        ctx = ctx if ctx is not None else zmq.Context.instance()
        self._sock = secure_client(ctx.socket(zmq.DEALER), addr=addr)
        self._sock.setsockopt(zmq.LINGER, 0)
        if sndhwm is not None:
            self._sock.setsockopt(zmq.SNDHWM, sndhwm)
        self._sock.connect(addr)

    def send(self, msg: Any) -> bool:
        """Queue ``msg`` without blocking; ``False`` if it could not be queued."""
        try:
            self._sock.send_multipart(self._codec.encode(msg), zmq.NOBLOCK)
        except zmq.ZMQError:
            return False
        return True

    def request(self, make: MakeRequest, timeout: float = 5.0, *, check: bool = True) -> Any:
        """Send ``make(id)`` and block for the reply to it (others are skipped).

        Raises:
            AgentTimeoutError, SecurityError, AgentError: as ``AgentClient.request``.
        """
        deadline = time.monotonic() + timeout
        req_id = self.begin(make)
        if req_id is None:
            raise _timeout(self.addr, timeout)
        return self.finish(req_id, deadline, timeout, check=check)

    def begin(self, make: MakeRequest) -> int | None:
        """Send ``make(id)`` without waiting; its id for ``finish`` (``None``: not sent)."""
        req_id = next(self._ids)
        return req_id if self.send(make(req_id)) else None

    def finish(self, req_id: int, deadline: float, timeout: float, *, check: bool = True) -> Any:
        """Block until the reply to ``req_id``, or ``deadline`` (``time.monotonic()``,
        ``timeout`` after the request was sent).

        Raises:
            AgentTimeoutError, SecurityError, AgentError: as ``AgentClient.request``.
        """
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sock.poll(max(1, int(left * 1000))):
                raise _timeout(self.addr, timeout)
            try:
                msg = self._codec.decode(self._sock.recv_multipart(zmq.NOBLOCK))
            except Exception:  # zmq.Again, or garbled: wait for a good one, or the deadline
                continue
            if getattr(msg, "id", None) == req_id:
                return _check(msg, self.addr) if check else msg

    def close(self, linger_ms: int = 0) -> None:
        """Close the socket, giving queued messages ``linger_ms`` to leave."""
        self._sock.close(linger=linger_ms)


def ask_all(addrs: list[str], make: MakeRequest, timeout: float) -> dict[str, Any]:
    """Ask every agent in ``addrs`` at once, blocking ``timeout`` in all; their replies.

    An agent that did not answer in time is left out of the result; a
    refusal is returned as the ``Ack`` it is (nothing is raised).
    """
    links = {addr: AgentLink(addr) for addr in dict.fromkeys(addrs)}
    try:
        deadline = time.monotonic() + timeout
        sent = {addr: link.begin(make) for addr, link in links.items()}
        out: dict[str, Any] = {}
        for addr, link in links.items():
            req_id = sent[addr]
            if req_id is None:
                continue
            try:
                out[addr] = link.finish(req_id, deadline, timeout, check=False)
            except AgentTimeoutError:
                continue
        return out
    finally:
        for link in links.values():
            link.close()

"""Cancelling a call from the caller's side, and the hint a timeout gives after one.

A call to one actor whose future is cancelled (``Future.cancel()``, the task
awaiting it cancelled, Ctrl+C in ``.get()``) stops waiting at once and tells
the proc with ``CancelCall`` on the same connection, so it arrives after the
call; ``zmesh._host.proc.cancelling`` says what the proc does with it.

A call given up on (cancelled, or timed out) whose proc has not answered it
yet is *abandoned*: the actor may still be running it (a sync endpoint runs
to its end, cancelled or not). Each connection (and each lane) keeps its
abandoned calls until the proc answers them, at most ``inflight.MAX_ABANDONED``, so
that a later call that times out behind them says so (``hint``), rather
than leaving its caller to guess why an idle-looking actor does not answer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import TYPE_CHECKING, Any

from zmesh._client.calls.connections import drain
from zmesh._client.calls.inflight import abandon
from zmesh._wire import messages as w

if TYPE_CHECKING:
    from zmesh._client.calls.connections import ProcConn
    from zmesh._client.calls.inflight import OneRequest
    from zmesh._wire.codec import Codec


def on_done(codec: Codec, req: OneRequest, fut: asyncio.Future[Any]) -> None:
    """A call's asyncio future is done: if it was cancelled, the proc is told."""
    if fut.cancelled():
        withdraw(codec, req)


def withdraw(codec: Codec, req: OneRequest) -> None:
    """Stop waiting for ``req`` and tell its proc (on the runtime's loop)."""
    c = req.conn
    if c.pending.pop(req.id, None) is None:
        return  # answered already, or never sent (``drain`` skips a done future)
    if req.timer is not None:
        req.timer.cancel()
    c.bytes -= req.size
    abandon(c.abandoned, req.id, "cancelled")
    if c.sock is not None:
        c.sock.send(codec.encode(w.CancelCall(req.id, req.actor)))
    if c.waiting:
        drain(c)


def cancel_sink(codec: Codec, conns: list[ProcConn], sink: Any) -> None:
    """Cancel the call whose answer goes to ``sink`` (a caller's ``.get()`` from a
    thread: a concurrent future, or an ``ActorSink`` of one), on one of
    ``conns``; ``sink`` fails with ``CancelledError``."""
    for c in conns:
        for req in list(c.pending.values()):
            if getattr(req, "fut", None) is sink:
                withdraw(codec, req)  # type: ignore[arg-type]  # (a OneRequest: it has a fut)
                break
    if not sink.done():  # sent, or still waiting to be (``drain`` then skips it)
        sink.set_exception(concurrent.futures.CancelledError())

"""A generator endpoint's items as Server-Sent Events.

One ``data: <json>`` event per item, then ``event: end``; an error after the
first item ends the stream with ``event: error`` (its data is the error
body). Errors before the first item are answered as statuses, as a call's
are (the response has not started yet).

The client going away cancels the stream: a task watches the request's
``receive`` for ``http.disconnect`` and cancels the pump, and the stream is
closed, which closes the generator in the replica (its ``finally`` runs)
and frees its slot. A slow client holds the pump in ``send``, which waits
while the server's write buffer is full (uvicorn's flow control), so the
stream's window stops the generator in the replica: nothing grows without
bound between the replica and the socket.
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec

from zmesh._errors import EncodeError
from zmesh.http.asgi import Receive, Send, respond
from zmesh.http.errors import body, describe, headers_for

# How long closing the stream in the replica may take once the reader is gone.
CLOSE_TIMEOUT = 5.0
_END = object()
_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # proxies (nginx) must not hold events back
]


def event(item: Any) -> bytes:
    """One item's event.

    Raises:
        EncodeError: JSON cannot carry the item (its type is named).
    """
    try:
        return b"data: " + msgspec.json.encode(item) + b"\n\n"
    except (TypeError, msgspec.EncodeError) as exc:
        raise EncodeError(
            f"an item of type {type(item).__qualname__} cannot be sent as JSON: {exc}"
        ) from exc


async def serve_stream(items: Any, send: Send, receive: Receive) -> int:
    """Send ``items`` (an ``ItemStream``) as events until it ends or the client goes;
    how many items were sent."""
    sent = [0]
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch, receive, tg.cancel_scope)
            await _pump(items, send, sent)
            tg.cancel_scope.cancel()  # done: stop watching
    finally:
        with anyio.move_on_after(CLOSE_TIMEOUT, shield=True):
            await items.aclose()
    return sent[0]


async def _watch(receive: Receive, scope: anyio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def _pump(items: Any, send: Send, sent: list[int]) -> None:
    try:
        first = await items.__anext__()
        data = event(first)
    except StopAsyncIteration:
        data = b""
    except Exception as exc:  # nothing sent yet: a status, as for a call
        status, kind, message = describe(exc)
        await respond(send, status, body(kind, message), headers_for(status))
        return
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
    try:
        if data:
            await send({"type": "http.response.body", "body": data, "more_body": True})
            sent[0] += 1
            async for item in items:
                await send({"type": "http.response.body", "body": event(item), "more_body": True})
                sent[0] += 1
        tail = b'event: end\ndata: {"items": %d}\n\n' % sent[0]
    except Exception as exc:  # after items: the stream says so and ends
        _, kind, message = describe(exc)
        tail = b"event: error\ndata: " + body(kind, message) + b"\n\n"
    await send({"type": "http.response.body", "body": tail, "more_body": False})

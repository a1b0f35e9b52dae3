"""The few pieces of ASGI the gateway speaks: a request's headers and body, a response."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON = b"application/json"


class BodyTooLarge(Exception):
    """A request body over the gateway's limit (answered 413)."""


def header(scope: Scope, name: bytes) -> bytes | None:
    """The value of request header ``name`` (lower case), if given."""
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


def path_of(scope: Scope) -> str:
    """The request's path below the app's mount point (``root_path``)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path or "/"


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body.

    Raises:
        BodyTooLarge: it is longer than ``limit`` bytes.
    """
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the request body is over {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def respond(
    send: Send,
    status: int,
    body: bytes,
    headers: Iterable[tuple[bytes, bytes]] = (),
    content_type: bytes = JSON,
) -> None:
    """Send a whole response."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})

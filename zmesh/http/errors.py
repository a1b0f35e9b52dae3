"""What an exception means over HTTP: a status, a JSON error body, and headers.

Every failure of a request is answered with ``{"error": {"type", "message"}}``:
404 for an unknown service or endpoint, 422 for arguments that do not fit,
500 when the endpoint raised (with the remote type and message), 503 with
``Retry-After`` when no replica can take it now, 504 when its timeout passed.
"""

from __future__ import annotations

import msgspec

from zmesh._errors import (
    ActorError,
    ActorStoppedError,
    AgentError,
    AgentTimeoutError,
    CallTimeoutError,
    EncodeError,
    EndpointError,
    HandleTypeError,
    NameNotFoundError,
    OverloadedError,
    ServiceError,
    SupervisionError,
)

# Seconds a client is asked to wait before it tries again (503).
RETRY_AFTER = "1"


def body(kind: str, message: str) -> bytes:
    """The JSON body of an error."""
    return msgspec.json.encode({"error": {"type": kind, "message": message}})


def describe(exc: BaseException) -> tuple[int, str, str]:
    """``(status, type, message)`` for an exception a request met."""
    if isinstance(exc, ActorError):
        return 500, exc.remote_type, exc.remote_message
    status = _status(exc)
    message = getattr(exc, "message", None) or str(exc)
    return status, type(exc).__name__, message


def _status(exc: BaseException) -> int:
    # Timeouts first: AgentTimeoutError is an AgentError too.
    if isinstance(exc, CallTimeoutError | AgentTimeoutError):
        return 504
    if isinstance(exc, NameNotFoundError | HandleTypeError):
        return 404
    if isinstance(exc, EndpointError):
        return 422
    if isinstance(exc, OverloadedError | ServiceError | ActorStoppedError | SupervisionError):
        return 503
    if isinstance(exc, AgentError):
        return 503
    if isinstance(exc, EncodeError):
        return 500
    return 500


def headers_for(status: int) -> list[tuple[bytes, bytes]]:
    """The extra headers of an error status."""
    return [(b"retry-after", RETRY_AFTER.encode())] if status == 503 else []

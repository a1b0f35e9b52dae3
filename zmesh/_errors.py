"""The exceptions zmesh raises.

Every error carries the context a user needs to act on it (mesh, rank, host,
log path) and builds its message in one place, ``__str__``.

Hierarchy::

    ZmeshError
    ├── ActorError            an endpoint raised; the actor is still alive
    ├── SpawnError            a proc or an actor could not be started
    │   └── DetachError           detached=True where nothing can outlive the script
    ├── SupervisionError      the rank broke: crash, kill, hang, agent lost; the actor died
    │   ├── ConnectionLostError   the connection to the proc dropped with the call on it
    │   ├── StreamInterruptedError  a service's stream broke after its first item
    │   └── ActorStoppedError     the rank was stopped on purpose (mesh.stop())
    ├── CallTimeoutError      the caller's deadline passed (also a TimeoutError)
    ├── EndpointError         unknown endpoint or arguments that do not fit it
    │   └── ResponsePortError     an explicit response port misused (also a ValueError)
    ├── EncodeError           an argument or return value cannot be sent
    ├── AgentError            an agent refused a request or cannot be reached
    │   └── AgentTimeoutError     it did not answer in time (also a TimeoutError)
    ├── SecurityError         keys missing or unreadable; an address needs keys
    ├── OverloadedError       a proc has too many of this caller's calls in flight
    │   └── PortFullError         a port's receiver holds its bound of unread values
    ├── NameNotFoundError     zmesh.lookup(name): no detached service or mesh of yours by that name
    ├── HandleTypeError       a handle is not of the class asked for (also a TypeError)
    └── ServiceError          a service cannot take the call
        ├── ServiceOverloadedError   every replica's queue is full (an OverloadedError too)
        └── SessionLostError         a strict session's replica (and its state) is gone

``ActorStoppedError`` ("you stopped it") is a ``SupervisionError`` ("it
broke"), as in Monarch, and still its own class, as trio tells
``ClosedResourceError`` from ``BrokenResourceError``: catch it first.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = [
    "ActorError",
    "ActorStoppedError",
    "AgentError",
    "AgentTimeoutError",
    "CallTimeoutError",
    "ConnectionLostError",
    "DetachError",
    "EncodeError",
    "EndpointError",
    "HandleTypeError",
    "NameNotFoundError",
    "OverloadedError",
    "PortFullError",
    "ResponsePortError",
    "SecurityError",
    "ServiceError",
    "ServiceOverloadedError",
    "SessionLostError",
    "SpawnError",
    "StreamInterruptedError",
    "SupervisionError",
    "ZmeshError",
]


class ZmeshError(Exception):
    """Root of every error zmesh raises.

    Args:
        message: what went wrong, in one sentence.
        mesh: the mesh involved, if any.
        rank: the flat rank involved, if any.
        host: the host (agent label or address) involved, if any.
        log_path: the proc's log file, if any.
    """

    def __init__(
        self,
        message: str = "",
        *,
        mesh: str | None = None,
        rank: int | None = None,
        host: str | None = None,
        log_path: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.mesh = mesh
        self.rank = rank
        self.host = host
        self.log_path = log_path

    def _context(self) -> list[str]:
        parts = []
        if self.mesh is not None:
            parts.append(f"mesh={self.mesh}")
        if self.rank is not None:
            parts.append(f"rank={self.rank}")
        if self.host is not None:
            parts.append(f"host={self.host}")
        if self.log_path is not None:
            parts.append(f"log={self.log_path}")
        return parts

    def __str__(self) -> str:
        ctx = self._context()
        return f"{self.message} ({', '.join(ctx)})" if ctx else self.message

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only context must survive pickling across processes.
        return (_rebuild, (type(self), self.message, self.__dict__))


def _rebuild(cls: type[ZmeshError], message: str, state: dict[str, Any]) -> ZmeshError:
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(state)
    return err


class ActorError(ZmeshError):
    """An endpoint raised an exception; the actor stays alive.

    Attributes:
        remote_type: the qualified name of the remote exception's type.
        remote_message: ``str()`` of the remote exception.
        remote_traceback: the remote traceback, formatted.
        endpoint: the endpoint that raised.
        cause: the remote exception itself when it could be unpickled here.
    """

    def __init__(
        self,
        remote_type: str,
        remote_message: str,
        remote_traceback: str = "",
        *,
        endpoint: str | None = None,
        cause: BaseException | None = None,
        **context: object,
    ) -> None:
        msg = f"{remote_type}: {remote_message}"
        if endpoint:
            msg = f"endpoint {endpoint!r} raised {msg}"
        super().__init__(msg, **context)  # type: ignore[arg-type]
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback
        self.endpoint = endpoint
        self.cause = cause

    def __str__(self) -> str:
        base = super().__str__()
        if self.remote_traceback:
            return f"{base}\n--- remote traceback ---\n{self.remote_traceback.rstrip()}"
        return base


class SpawnError(ZmeshError):
    """A proc or an actor could not be started (``__init__`` raised, proc died)."""


class DetachError(SpawnError):
    """``detached=True`` asked of an agent that ends with the script (the embedded default).

    Start an agent that outlives scripts (``zmesh agent``, ``zmesh cluster``,
    ``zmesh up``) and point ``ZMESH_AGENTS`` (or ``zmesh.connect``) at it.
    """


class SupervisionError(ZmeshError, RuntimeError):
    """The rank a call went to broke: it crashed, was killed, hung, or its host was lost;
    or the actor died (an exception with no caller to go to, as in Monarch).

    A ``RuntimeError`` too, as Monarch's is.

    Attributes:
        reason: the supervision reason, e.g. ``"killed by SIGKILL"``.
    """

    def __init__(self, message: str = "", *, reason: str = "", **context: object) -> None:
        super().__init__(message, **context)  # type: ignore[arg-type]
        self.reason = reason


class ConnectionLostError(SupervisionError):
    """The connection to the proc dropped while the call was on it.

    The call may or may not have run; its reply is lost. The proc itself
    may be alive: later calls go out on a new connection.
    """


class StreamInterruptedError(SupervisionError):
    """A service's stream lost its replica after the first item.

    Before the first item a dead replica costs nothing but time: the request
    moves to another replica unseen. After it, re-running the request would
    repeat items the reader already has, so the stream ends with this error.

    Attributes:
        replica: the index of the replica that broke.
        generation: its generation.
        items: how many items the reader had been given.
    """

    def __init__(
        self,
        message: str = "",
        *,
        replica: int | None = None,
        generation: int | None = None,
        items: int = 0,
        **context: object,
    ) -> None:
        super().__init__(message, **context)  # type: ignore[arg-type]
        self.replica = replica
        self.generation = generation
        self.items = items


class ActorStoppedError(SupervisionError):
    """The rank was stopped on purpose (``mesh.stop()`` or shutdown).

    A ``SupervisionError`` too, as Monarch's is: ``except SupervisionError``
    catches every call that cannot be answered; catch this one first to tell
    "you stopped it" from "it broke".
    """


class CallTimeoutError(ZmeshError, TimeoutError):
    """The caller's timeout passed before the reply arrived."""


class EndpointError(ZmeshError):
    """The endpoint does not exist or the arguments do not fit its signature."""


class ResponsePortError(EndpointError, ValueError):
    """An ``explicit_response_port`` endpoint did not answer through its port as it must.

    The caller gets it when the endpoint returned a value instead of sending
    it on the port, or when the port was dropped (garbage collected) without
    a value sent on it: nothing could answer the call any more. The sender
    gets it (also a ``ValueError``, as a once port's second send is) when it
    sends a second answer on the port.

    Attributes:
        endpoint: the endpoint, ``Class.method``.
        mistake: ``"returned a value"``, ``"dropped the port"`` or ``"sent twice"``.
    """

    def __init__(
        self, message: str = "", *, endpoint: str = "", mistake: str = "", **context: object
    ) -> None:
        super().__init__(message, **context)  # type: ignore[arg-type]
        self.endpoint = endpoint
        self.mistake = mistake


class EncodeError(ZmeshError):
    """An argument or a return value cannot be encoded for the wire.

    When pickling a value raised (its ``__getstate__``, a lock, a socket),
    the error is also of that exception's type (``encode_error``): code
    written for Monarch, which raises the pickling error itself, catches it
    as that (``except RuntimeError``, ``except TypeError``), and zmesh code
    as an ``EncodeError``.
    """


# EncodeError subclasses made for a pickling error's type, by that type.
_ALSO: dict[type[BaseException], type[EncodeError]] = {}


def encode_error(message: str, cause: BaseException, **context: Any) -> EncodeError:
    """An ``EncodeError`` for a value whose encoding raised ``cause``: also an
    instance of ``cause``'s type when the two can be combined (an
    ``Exception`` that is not zmesh's and that Python lets a class derive from)."""
    return _also(type(cause))(message, **context)


def _also(kind: type[BaseException]) -> type[EncodeError]:
    cls = _ALSO.get(kind)
    if cls is not None:
        return cls
    cls = EncodeError
    if issubclass(kind, Exception) and not issubclass(kind, ZmeshError):
        try:
            cls = type("EncodeError", (EncodeError, kind), {"__reduce__": _reduce_also})
            cls.__module__ = "zmesh"
        except TypeError:  # a final type, or one whose layout cannot be combined
            cls = EncodeError
    _ALSO[kind] = cls
    return cls


def _reduce_also(self: EncodeError) -> tuple[Any, ...]:
    # The combined class has no importable name: rebuild it from its other base.
    also = type(self).__bases__[1]
    return (_rebuild_also, (also, self.message, self.__dict__))


def _rebuild_also(also: type[BaseException], message: str, state: dict[str, Any]) -> EncodeError:
    err = _rebuild(_also(also), message, state)
    assert isinstance(err, EncodeError)
    return err


class AgentError(ZmeshError):
    """A host agent refused a request, or cannot be reached."""


# Before Python 3.11 asyncio.TimeoutError is its own class: code that waits
# on an agent with ``except asyncio.TimeoutError`` must catch this one too.
_TIMEOUTS: tuple[type[Exception], ...] = (TimeoutError,)
if sys.version_info < (3, 11):  # pragma: no cover
    import asyncio

    _TIMEOUTS += (asyncio.TimeoutError,)


class AgentTimeoutError(AgentError, *_TIMEOUTS):  # type: ignore[misc]
    """A host agent did not answer a request in time (down, or cut off).

    Also a ``TimeoutError`` (and an ``asyncio.TimeoutError``).
    """


class SecurityError(ZmeshError):
    """CURVE keys are missing or unreadable, or an address needs keys it was not given."""


class OverloadedError(ZmeshError):
    """Too many calls from this caller are in flight to one proc.

    Raised only for calls made with ``.options(block=False)``; by default a
    call over the in-flight limit waits its turn (in order) instead.
    """


class PortFullError(OverloadedError):
    """``Port.send`` refused a value: its receiver is not keeping up.

    Either the ``PortReceiver`` holds its bound of unread values (count or
    bytes) and said so, or the receiving process has not read what this
    process already sent to it (its bound of values or bytes in the pipe:
    it is gone, or far behind). Nothing was sent; a later ``send`` succeeds
    once the receiver has read enough.

    Attributes:
        port: the port's number.
        reason: ``"receiver full"`` or ``"receiver not reading"``.
    """

    def __init__(self, message: str = "", *, port: int = 0, reason: str = "",
                 **context: object) -> None:  # fmt: skip
        super().__init__(message, **context)  # type: ignore[arg-type]
        self.port = port
        self.reason = reason


class NameNotFoundError(ZmeshError):
    """``zmesh.lookup(name)`` found no detached service or mesh of yours by that name.

    Attributes:
        name: the name asked for.
        names: the names that do exist for your keys on the agents asked.
    """

    def __init__(self, message: str = "", *, name: str = "", names: list[str] | None = None,
                 **context: object) -> None:  # fmt: skip
        super().__init__(message, **context)  # type: ignore[arg-type]
        self.name = name
        self.names = list(names or [])


class HandleTypeError(ZmeshError, TypeError):
    """A handle is not what it was asked to be.

    ``zmesh.lookup(name, Cls)`` found ``name``, but it is a service or mesh
    of another class; ``zmesh.service_info(x)`` got something that is not a
    service.

    Attributes:
        name: the name looked up (``""`` if none was).
        kind: what was found: ``"service"``, ``"mesh"``, or the type's name.
        found: the class name of the handle's actors (``""`` if it has none).
        expected: what was asked for (a class name, or ``"a service"``).
    """

    def __init__(self, message: str = "", *, name: str = "", kind: str = "", found: str = "",
                 expected: str = "", **context: object) -> None:  # fmt: skip
        super().__init__(message, **context)  # type: ignore[arg-type]
        self.name = name
        self.kind = kind
        self.found = found
        self.expected = expected


class ServiceError(ZmeshError):
    """A service cannot take the call (no healthy replica before the timeout)."""


class ServiceOverloadedError(ServiceError, OverloadedError):
    """Every replica's queue is full: overload is an error, not a hang."""


class SessionLostError(ServiceError):
    """A strict session's replica generation is gone, and the state it kept with it.

    Raised by the first call of a ``svc.session(strict=True)`` after its
    replica died (even if it was respawned since). The session is unbound:
    the next call binds it to a healthy replica afresh.
    """


# Tracebacks, reprs and pickles name the errors as users import them
# (``zmesh.ActorError``, not ``zmesh._errors.ActorError``), as trio does for
# its own. Unpickling finds them there too: ``zmesh`` re-exports every one.
for _name in __all__:
    globals()[_name].__module__ = "zmesh"
del _name

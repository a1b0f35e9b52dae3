"""What a class declares: ``@endpoint`` methods, and which actor runs now.

Every process knows these: a user's ``zmesh.Actor`` subclass (the face's
``Actor``, in ``zmesh._options``) is an ``ActorBase`` with endpoints.
"""

from __future__ import annotations

import contextvars
import dataclasses
import enum
import functools
import inspect
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    TypeVar,
    overload,
)

from zmesh._shared.points import Point

if TYPE_CHECKING:
    from zmesh._client.calls.runtime import ProcRef
    from zmesh._typing import (
        Adverbs,
        BatchEndpointify,
        Endpointify,
        HandleFace,
        PortedEndpointify,
        StreamEndpoint,
    )

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


# A streaming endpoint's producer runs at most this many items ahead of its
# consumer, unless ``@endpoint(window=...)`` or ``ref.options(window=...)`` says.
DEFAULT_WINDOW = 64


@dataclass(frozen=True)
class EndpointInfo:
    """How an endpoint runs."""

    name: str
    is_async: bool
    concurrent: bool = False  # may run while other messages to the actor run
    retry: bool = True  # a service may re-send it to another replica
    stream: bool = False  # a generator: its items stream back (zmesh._client.ports.streams)
    window: int = DEFAULT_WINDOW  # a stream's items in flight ahead of its consumer, at most
    port: bool = False  # takes a response port first (``explicit_response_port``)
    batch: int = 0  # > 0: up to this many calls are run as one invocation
    batch_wait: float = 0.0  # seconds a batch waits for more calls after its first
    # A detached service's: its parameters and types, packed (zmesh._service.signatures).
    signature: bytes = b""


class Answers(enum.IntEnum):
    """How an endpoint answers a call, which says what its adverbs return."""

    VALUE = 0  # its return value, through a future (0: ``if answers:`` means "not a value")
    STREAM = 1  # a generator's items, through an ``ItemStream`` read ahead by its window
    PORT = 2  # through the response port it is given first (``explicit_response_port``)


class Endpoint(Generic[P, R]):
    """An actor method callable remotely; made by ``@zmesh.endpoint``.

    Inside the actor, ``self.method(...)`` is a plain method call. On a mesh
    handle, ``mesh.method`` offers the adverbs (``call``, ``call_one``, ...).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        concurrent: bool = False,
        retry: bool = True,
        window: int = DEFAULT_WINDOW,
        explicit_response_port: bool = False,
        batch: int = 0,
        batch_wait: float = 0.0,
    ):
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive int, not {window!r}")
        if batch < 0 or batch_wait < 0:
            raise ValueError(f"batch and batch_wait must be >= 0, got {batch} and {batch_wait}")
        self.fn = fn
        self.info = EndpointInfo(
            name=fn.__name__,
            is_async=inspect.iscoroutinefunction(fn),
            concurrent=concurrent,
            retry=retry,
            stream=inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn),
            window=window,
            port=explicit_response_port,
            batch=batch,
            batch_wait=batch_wait,
        )
        functools.update_wrapper(self, fn)

    def __set_name__(self, owner: type, name: str) -> None:
        self.info = dataclasses.replace(self.info, name=name)

    # Read from the class: the endpoint. From an instance: in the actor the
    # bound method, on a handle the adverbs; typed as the handle's (the
    # checker sees a handle as an instance of its class: zmesh._typing).
    @overload
    def __get__(self, obj: None, objtype: Any = None) -> Endpoint[P, R]: ...
    @overload
    def __get__(self, obj: object, objtype: Any = None) -> Adverbs[P, R]: ...
    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return self.fn.__get__(obj, objtype)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        raise TypeError(
            f"endpoint {self.info.name!r} is called through an actor: "
            "use self.{name}(...) inside the actor or mesh.{name}.call(...) outside"
        )


# The overloads type an endpoint by its method (zmesh._typing): ``async def``
# gives its awaited result, a generator its items. Awaitable comes first, so
# that a method typed ``-> Any`` (or not at all) is a plain endpoint.
@overload
def endpoint(fn: Callable[Concatenate[Any, P], Awaitable[R]]) -> Endpoint[P, R]: ...
@overload
def endpoint(  # type: ignore[overload-overlap]
    fn: Callable[Concatenate[Any, P], AsyncIterator[T]],
) -> StreamEndpoint[P, T]: ...
@overload
def endpoint(  # type: ignore[overload-overlap]
    fn: Callable[Concatenate[Any, P], Iterator[T]],
) -> StreamEndpoint[P, T]: ...
@overload
def endpoint(fn: Callable[Concatenate[Any, P], R]) -> Endpoint[P, R]: ...
@overload
def endpoint(  # type: ignore[overload-overlap]  # batch=0 is no batch
    *,
    concurrent: bool = False,
    retry: bool = True,
    window: int = DEFAULT_WINDOW,
    explicit_response_port: Literal[False] = False,
    batch: Literal[0] = 0,
    batch_wait: float = 0.0,
) -> Endpointify: ...
@overload
def endpoint(
    *,
    concurrent: bool = False,
    retry: bool = True,
    window: int = DEFAULT_WINDOW,
    explicit_response_port: Literal[True],
    batch: Literal[0] = 0,
    batch_wait: float = 0.0,
) -> PortedEndpointify: ...
@overload
def endpoint(
    *,
    concurrent: bool = False,
    retry: bool = True,
    window: int = DEFAULT_WINDOW,
    explicit_response_port: Literal[False] = False,
    batch: int,
    batch_wait: float = 0.0,
) -> BatchEndpointify: ...
def endpoint(
    fn: Callable[..., Any] | None = None,
    *,
    concurrent: bool = False,
    retry: bool = True,
    window: int = DEFAULT_WINDOW,
    explicit_response_port: bool = False,
    batch: int = 0,
    batch_wait: float = 0.0,
) -> Any:
    """Mark an actor method as an endpoint. Sync or ``async`` methods both work.

    Async endpoints run on the proc's event loop. Sync endpoints run in a
    worker thread, so one that blocks for seconds never stalls the proc's
    I/O, its heartbeats, or the other actors in the proc. A generator (or
    async generator) endpoint streams its items to the caller as it yields
    them; while its stream is open it is the actor's message in progress.

    Args:
        fn: the method.
        concurrent: let messages to this endpoint run while the actor handles
            others (by default an actor handles one message at a time).
        retry: whether a service may re-send a request that was in flight on
            a replica that died (at-least-once). With ``False`` the caller gets
            ``SupervisionError`` instead.
        window: for a generator endpoint (``def`` with ``yield``, or an
            async generator), how many items its producer may run ahead of
            the consumer (credit-based flow control; see docs/streams.md).
        explicit_response_port: the method takes a ``Port`` first and answers
            through it (``port.send(value)``), later or several times, as
            in Monarch; callers use the adverbs as for any endpoint.
        batch: run up to this many pending calls as one invocation. The
            method takes a list and returns a list of the same length; each
            caller sends one item and gets its own element back (or the
            exception, if the invocation raised). Batches run one at a time,
            beside the actor's other messages.
        batch_wait: how long a batch waits for more calls after its first,
            in seconds, before it runs with what it has.

    Example::

        class Counter(zmesh.Actor):
            @zmesh.endpoint
            async def incr(self, by: int = 1) -> int: ...
    """
    opts: dict[str, Any] = {
        "concurrent": concurrent, "retry": retry, "window": window,
        "explicit_response_port": explicit_response_port,
    }  # fmt: skip
    if batch:
        opts.update(batch=batch, batch_wait=batch_wait)
    if fn is None:
        return lambda f: Endpoint(f, **opts)
    return Endpoint(fn, **opts)


@overload
def concurrent_endpoint(fn: Callable[Concatenate[Any, P], Awaitable[R]]) -> Endpoint[P, R]: ...
@overload
def concurrent_endpoint(  # type: ignore[overload-overlap]
    fn: Callable[Concatenate[Any, P], AsyncIterator[T]],
) -> StreamEndpoint[P, T]: ...
@overload
def concurrent_endpoint(  # type: ignore[overload-overlap]
    fn: Callable[Concatenate[Any, P], Iterator[T]],
) -> StreamEndpoint[P, T]: ...
@overload
def concurrent_endpoint(fn: Callable[Concatenate[Any, P], R]) -> Endpoint[P, R]: ...
@overload
def concurrent_endpoint(*, retry: bool = True) -> Endpointify: ...
def concurrent_endpoint(fn: Callable[..., Any] | None = None, *, retry: bool = True) -> Any:
    """``@endpoint(concurrent=True)``, by Monarch's name: may run while others do."""
    if fn is None:
        return lambda f: Endpoint(f, concurrent=True, retry=retry)
    return Endpoint(fn, concurrent=True, retry=retry)


def endpoints_of(cls: type) -> dict[str, EndpointInfo]:
    """The endpoints of an actor class, by name."""
    found: dict[str, EndpointInfo] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, Endpoint):
                found[name] = value.info
    return found


_CURRENT: contextvars.ContextVar[Point] = contextvars.ContextVar("zmesh_point")
# The service request being handled (the same id across retries).
_REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("zmesh_request", default="")
# The actor instance whose endpoint is running: it owns meshes it spawns.
_CURRENT_ACTOR: contextvars.ContextVar[Any] = contextvars.ContextVar("zmesh_actor")

# The name of the actor whose code runs (its mesh's actor name).
_ACTOR_NAME: contextvars.ContextVar[str] = contextvars.ContextVar("zmesh_actor_name")
# The call a sync endpoint's thread runs for (``zmesh._host.proc.cancelling.Running``),
# set by the proc around it: what ``call_cancelled()`` reads.
_CALL: contextvars.ContextVar[Any] = contextvars.ContextVar("zmesh_call")
# This process's own proc, when it is one (set by zmesh._host.proc.procserver once it binds).
_own_proc: ProcRef | None = None


def set_actor_name(name: str) -> None:
    """Name, in the running context, the actor whose code runs (the proc calls it)."""
    _ACTOR_NAME.set(name)


def set_call(call: Any) -> None:
    """Say, in the running context, which call a sync endpoint runs for (the proc calls it)."""
    _CALL.set(call)


def call_cancelled() -> bool:
    """Whether the caller cancelled the call the running sync endpoint answers.

    A sync (``def``) endpoint cannot be interrupted: it runs to its end and
    its result is dropped. One that works in steps can check this between
    them and return early, which frees its actor for the next message. An
    ``async def`` endpoint is cancelled where it awaits instead
    (``CancelledError``). ``False`` anywhere else.

    Example::

        @zmesh.endpoint
        def train(self, steps: int) -> int:
            for step in range(steps):
                if zmesh.call_cancelled():
                    return step
                self.step()
            return steps
    """
    call = _CALL.get(None)
    return call is not None and bool(call.cancelled)


def set_own_proc(ref: ProcRef) -> None:
    """Say which proc this process is (``this_proc()``, ``context().actor_instance.proc``)."""
    global _own_proc
    _own_proc = ref


def own_proc() -> ProcRef | None:
    """This process's proc, or ``None`` in a client."""
    return _own_proc


def set_current(point: Point | None = None, actor: Any = None, request: str | None = None) -> None:
    """Set, in the running context, the actor (its point and instance) and the
    request an endpoint runs for: what ``current_rank()``, ``current_request()``
    and ``owner_actor()`` read. Only the proc (``zmesh._host.proc.procserver``) calls it."""
    if point is not None:
        _CURRENT.set(point)
    if actor is not None:
        _CURRENT_ACTOR.set(actor)
    if request is not None:
        _REQUEST.set(request)


def current_point() -> Point | None:
    """The calling actor's point (``None`` outside an actor): ``current_rank()``
    for code that runs both inside and outside actors."""
    return _CURRENT.get(None)


def owner_actor() -> Any:
    """The actor instance whose endpoint is running here (``None`` outside one):
    the owner of the meshes it spawns."""
    return _CURRENT_ACTOR.get(None)


def current_rank() -> Point:
    """The calling actor's point in its mesh. Only valid inside an endpoint.

    Raises:
        RuntimeError: when called outside an actor.
    """
    try:
        return _CURRENT.get()
    except LookupError:
        raise RuntimeError("current_rank() is only available inside an actor") from None


def current_request() -> str:
    """The id of the service request the calling endpoint is handling.

    A service may deliver a request more than once (it re-sends requests
    that were in flight on a replica that died); the id is the same each
    time, so an actor can deduplicate. ``""`` outside a service call.
    """
    return _REQUEST.get()


# What a handle has of its own: the public attributes of ActorMesh and of
# Service (tests/unit/test_mistakes.py checks that none is missing), for a
# class defined before those are imported. A script's first class must not
# import the service machinery (~50 ms of a cold start) to be checked.
_HANDLE_ATTRS = {
    "actor", "cls_module", "cls_name", "endpoints", "extent", "flatten", "full_dims", "initialized",
    "proc_mesh", "points", "replica", "session", "size", "sizes", "slice", "state",
    "statistics", "stop", "supervision_events",
}  # fmt: skip
# ``get`` is not refused, as Monarch does not refuse it: an endpoint named
# ``get`` wins over the handle's ``as_actor().get(timeout)`` (which waits for
# the mesh; ``mesh.initialized.get(timeout)`` still does).


def reserved_names() -> set[str]:
    """Names an endpoint may not have: every public attribute of the handles."""
    names = set(_HANDLE_ATTRS)
    for module, cls_name in (
        ("zmesh._client.handles.mesh", "ActorMesh"),
        ("zmesh._service.service", "Service"),
    ):
        cls = getattr(sys.modules.get(module), cls_name, None)  # only if imported already
        if cls is not None:
            names.update(n for n in dir(cls) if not n.startswith("_"))
    return names


def check_endpoint_names(cls: type) -> None:
    """Refuse endpoints that a handle's own attribute would hide.

    Raises:
        TypeError: naming the endpoint, what shadows it and the fix.
    """
    endpoints = [n for n, v in vars(cls).items() if isinstance(v, Endpoint)]
    if not endpoints:
        return
    clash = sorted(set(endpoints) & reserved_names())
    if clash:
        name = clash[0]
        other = "value" if name == "get" else f"get_{name}"
        raise TypeError(
            f"{cls.__name__}.{name}: an endpoint may not be named {name!r}: on a mesh or "
            f"service handle, .{name} is the handle's own, so calls would never reach the "
            f"endpoint. Rename it (e.g. {name}_ or {other}). Reserved names: "
            f"{', '.join(sorted(reserved_names()))}"
        )


if TYPE_CHECKING:
    _Handle = HandleFace  # a handle's own methods, for the checker (zmesh._typing)
else:
    _Handle = object


class ActorBase(_Handle):
    """What every process knows of an actor class: the checks made when one
    is defined, and its logger.

    Users subclass ``zmesh.Actor`` (``zmesh._options``), which adds
    ``options()``; zmesh's own code refers to this base, below the spawning
    machinery that ``options()`` reaches.

    Attributes:
        survive_errors: whether the actor outlives an error with no caller
            to go to (see ``zmesh.Actor``).
    """

    survive_errors: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_endpoint_names(cls)  # an endpoint a handle's own attribute would hide

    @property
    def logger(self) -> logging.Logger:
        """A logger named after the class; in a proc its lines go to the proc's log."""
        return logging.getLogger(f"zmesh.actor.{type(self).__qualname__}")

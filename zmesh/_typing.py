"""What a type checker sees of handles and endpoints. Nothing here runs.

A handle's endpoints are the attributes of its actor class, so zmesh types a
handle *as that class*, as Monarch does: ``Counter.options().as_actor()``,
``procs.spawn("c", Counter)`` and ``await Counter.options(replicas=2)
.as_service()`` are a ``Counter`` to mypy and pyright. ``@zmesh.endpoint``
turns each method into a descriptor that, read from an instance, is
``Adverbs[P, R]`` (``P`` the method's parameters after ``self``, ``R`` its
result, an ``async def``'s awaited result) or, for a generator method,
``StreamAdverbs[P, T]`` (``T`` what it yields). So ``mesh.incr.call_one(1)``
is a ``Future[int]`` and ``mesh.incr.call_one("x")`` is an error. Both are
the handle's ``EndpointRef`` with the endpoint's signature.

The handle's own methods (``slice``, ``stop``, ``initialized``, ...) are
declared on ``zmesh.Actor`` for the checker only (``HandleFace``), and
``zmesh.ActorMesh[Counter]`` / ``zmesh.Service[Counter]`` are other names
for ``Counter``. At run time none of this exists: ``zmesh.Actor`` has no
base but ``object``, ``zmesh.ActorMesh`` is the handle class
(``zmesh._client.handles.mesh``), and this module is only imported under
``TYPE_CHECKING``.

What the checker cannot tell apart: inside an actor ``self.incr`` is typed
as on a handle (there it is the plain method); ``isinstance(x,
zmesh.ActorMesh)`` works at run time, but pyright refuses an alias there.
"""

# The bodies are declarations: the real ones are the handles'.
# mypy: disable-error-code="empty-body"
from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Iterator
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    ParamSpec,
    Protocol,
    TypeAlias,
    TypeVar,
    overload,
)

from zmesh._client.handles.adverbs import EndpointRef

if TYPE_CHECKING:
    from zmesh._actor import ActorBase, Endpoint
    from zmesh._client.calls.future import Future
    from zmesh._client.calls.runtime import ProcRef
    from zmesh._client.calls.values import ValueMesh
    from zmesh._client.control.controller import SupervisionEvent
    from zmesh._client.control.meshstate import MeshState
    from zmesh._client.ports.channels import Port
    from zmesh._client.ports.streams import ItemStream
    from zmesh._service.routing import ServiceStatistics, Session
    from zmesh._shared.points import Extent, Point

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
X = TypeVar("X")
Y = TypeVar("Y")
A = TypeVar("A", bound="ActorBase")
H = TypeVar("H", bound="HandleFace")

# ``zmesh.ActorMesh[Counter]`` and ``zmesh.Service[Counter]``: a handle of
# Counters is typed as a ``Counter`` (see the module docstring).
ActorMesh: TypeAlias = A
Service: TypeAlias = A


class Replies(Protocol[T_co]):
    """``ref.stream(...)``: the replies of a fan-out, read with ``for`` or ``async for``."""

    def __iter__(self) -> Iterator[T_co]: ...
    def __aiter__(self) -> AsyncIterator[T_co]: ...


class Adverbs(EndpointRef[R], Generic[P, R]):
    """``mesh.endpoint`` (and ``svc.endpoint``) of an endpoint ``(self, *P) -> R``.

    The handle's ``EndpointRef`` (so ``zmesh.send`` and ``Accumulator`` take
    it), with the endpoint's parameters. On a service, ``call`` answers a
    list of the replicas' values (by replica index) rather than a
    ``ValueMesh``; ``block`` and ``window`` are mesh options and ``session``
    a service one.
    """

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]: ...
    def call_one(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]: ...
    def choose(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]: ...
    def call(self, *args: P.args, **kwargs: P.kwargs) -> Future[ValueMesh[R]]: ...
    def broadcast(self, *args: P.args, **kwargs: P.kwargs) -> None: ...
    def stream(self, *args: P.args, **kwargs: P.kwargs) -> Replies[R]: ...  # type: ignore[override]
    def options(
        self,
        *,
        timeout: float | None = None,
        block: bool = True,
        window: int | None = None,
        session: str | Session | None = None,
    ) -> Adverbs[P, R]: ...


class StreamAdverbs(EndpointRef[T], Generic[P, T]):
    """``mesh.endpoint`` of a generator endpoint ``(self, *P) -> Iterator[T]``
    (or ``AsyncIterator[T]``): its items stream back (docs/streams.md)."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> ItemStream[T]: ...  # type: ignore[override]
    def call_one(self, *args: P.args, **kwargs: P.kwargs) -> ItemStream[T]: ...  # type: ignore[override]
    def choose(self, *args: P.args, **kwargs: P.kwargs) -> ItemStream[T]: ...  # type: ignore[override]
    def call(  # type: ignore[override]
        self, *args: P.args, **kwargs: P.kwargs
    ) -> ItemStream[tuple[Point, T]]: ...
    def options(
        self,
        *,
        timeout: float | None = None,
        block: bool = True,
        window: int | None = None,
        session: str | Session | None = None,
    ) -> StreamAdverbs[P, T]: ...


class StreamEndpoint(Protocol[P, T]):
    """What ``@zmesh.endpoint`` makes of a generator method (an ``Endpoint`` at run time)."""

    @overload
    def __get__(self, obj: None, objtype: Any = None) -> Endpoint[P, Iterator[T]]: ...
    @overload
    def __get__(self, obj: object, objtype: Any = None) -> StreamAdverbs[P, T]: ...


class Endpointify(Protocol):
    """``@zmesh.endpoint(...)`` with arguments: the decorator it returns keeps the types."""

    @overload
    def __call__(self, fn: Callable[Concatenate[Any, P], Awaitable[R]]) -> Endpoint[P, R]: ...
    @overload
    def __call__(  # type: ignore[overload-overlap]
        self, fn: Callable[Concatenate[Any, P], AsyncIterator[T]]
    ) -> StreamEndpoint[P, T]: ...
    @overload
    def __call__(  # type: ignore[overload-overlap]
        self, fn: Callable[Concatenate[Any, P], Iterator[T]]
    ) -> StreamEndpoint[P, T]: ...
    @overload
    def __call__(self, fn: Callable[Concatenate[Any, P], R]) -> Endpoint[P, R]: ...


class BatchEndpointify(Protocol):
    """``@zmesh.endpoint(batch=N)``: ``(self, items: list[X]) -> list[Y]`` is called
    one item at a time, as ``(X) -> Y``."""

    @overload
    def __call__(self, fn: Callable[[Any, list[X]], Awaitable[list[Y]]]) -> Endpoint[[X], Y]: ...
    @overload
    def __call__(self, fn: Callable[[Any, list[X]], list[Y]]) -> Endpoint[[X], Y]: ...


class PortedEndpointify(Protocol):
    """``@zmesh.endpoint(explicit_response_port=True)``: ``(self, port: Port[R], *P)``
    is called as ``(*P) -> R``."""

    @overload
    def __call__(
        self, fn: Callable[Concatenate[Any, Port[R], P], Awaitable[None]]
    ) -> Endpoint[P, R]: ...
    @overload
    def __call__(self, fn: Callable[Concatenate[Any, Port[R], P], None]) -> Endpoint[P, R]: ...


class Spawned(Protocol[T_co]):
    """``Options.spawn()``: a mesh, or a future of a service; ``await`` or ``.get()`` it."""

    def __await__(self) -> Generator[Any, None, T_co]: ...
    def get(self, timeout: float | None = None) -> T_co: ...


class HandleFace:
    """The handle's own attributes, declared on ``zmesh.Actor`` for the checker.

    Mesh handles have all but the service ones (``session``,
    ``statistics``, ``replica``); service handles have ``stop``, ``len()``
    and those. An endpoint may not be named like most of them
    (``zmesh._actor.check_endpoint_names``); one named ``get`` hides ``mesh.get``.
    """

    # The handle fields that tests and tools read; fields an actor of its
    # own is likely to have (a service's id, name, config) are left out:
    # zmesh.service_info(svc) gives those, typed (zmesh._service.info).
    actor: str
    proc_mesh: str
    _refs: list[ProcRef]

    @property
    def initialized(self) -> Future[None]: ...
    @property
    def extent(self) -> Extent: ...
    @property
    def sizes(self) -> dict[str, int]: ...
    def size(self, dim: str | Iterable[str] | None = None) -> int: ...
    def slice(self: H, **sel: int | builtins.slice) -> H: ...
    def flatten(self: H, name: str) -> H: ...
    def points(self) -> list[Point]: ...
    def state(self) -> MeshState: ...
    def supervision_events(self) -> AsyncIterator[SupervisionEvent]: ...
    def stop(self) -> Future[None]: ...
    def get(self: H, timeout: float | None = None) -> H: ...
    def __await__(self: H) -> Generator[Any, None, H]: ...
    def __len__(self) -> int: ...

    # A service's own.

    def session(self, session_id: str | None = None, *, strict: bool = False) -> Session: ...
    def statistics(self) -> ServiceStatistics: ...
    def replica(self: H, index: int) -> H | None: ...

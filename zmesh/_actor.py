"""What users write: ``Actor`` subclasses with ``@endpoint`` methods."""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from zmesh._shared.points import Point

if TYPE_CHECKING:
    from zmesh._client.future import Future
    from zmesh._client.mesh import ActorMesh
    from zmesh._service.service import Service

P = ParamSpec("P")
R = TypeVar("R")
A = TypeVar("A", bound="Actor")


@dataclass(frozen=True)
class EndpointInfo:
    """How an endpoint runs."""

    name: str
    is_async: bool
    concurrent: bool = False  # may run while other messages to the actor run
    retry: bool = True  # a service may re-send it to another replica


class Endpoint(Generic[P, R]):
    """An actor method callable remotely; made by ``@zmesh.endpoint``.

    Inside the actor, ``self.method(...)`` is a plain method call. On a mesh
    handle, ``mesh.method`` offers the adverbs (``call``, ``call_one``, ...).
    """

    def __init__(self, fn: Callable[..., Any], *, concurrent: bool = False, retry: bool = True):
        self.fn = fn
        self.info = EndpointInfo(
            name=fn.__name__,
            is_async=inspect.iscoroutinefunction(fn),
            concurrent=concurrent,
            retry=retry,
        )
        functools.update_wrapper(self, fn)

    def __set_name__(self, owner: type, name: str) -> None:
        self.info = EndpointInfo(name, self.info.is_async, self.info.concurrent, self.info.retry)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return self.fn.__get__(obj, objtype)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        raise TypeError(
            f"endpoint {self.info.name!r} is called through an actor: "
            "use self.{name}(...) inside the actor or mesh.{name}.call(...) outside"
        )


@overload
def endpoint(fn: Callable[Concatenate[Any, P], Awaitable[R]]) -> Endpoint[P, R]: ...
@overload
def endpoint(fn: Callable[Concatenate[Any, P], R]) -> Endpoint[P, R]: ...
@overload
def endpoint(
    *, concurrent: bool = False, retry: bool = True
) -> Callable[[Callable[..., Any]], Endpoint[Any, Any]]: ...
def endpoint(
    fn: Callable[..., Any] | None = None, *, concurrent: bool = False, retry: bool = True
) -> Any:
    """Mark an actor method as an endpoint. Sync or ``async`` methods both work.

    Async endpoints run on the proc's event loop. Sync endpoints run in a
    worker thread, so one that blocks for seconds never stalls the proc's
    I/O, its heartbeats, or the other actors in the proc.

    Args:
        fn: the method.
        concurrent: let messages to this endpoint run while the actor handles
            others (by default an actor handles one message at a time).
        retry: whether a service may re-send a request that was in flight on
            a replica that died (at-least-once). With ``False`` the caller gets
            ``SupervisionError`` instead.

    Example::

        class Counter(zmesh.Actor):
            @zmesh.endpoint
            async def incr(self, by: int = 1) -> int: ...
    """
    if fn is None:
        return lambda f: Endpoint(f, concurrent=concurrent, retry=retry)
    return Endpoint(fn, concurrent=concurrent, retry=retry)


@overload
def concurrent_endpoint(fn: Callable[Concatenate[Any, P], Awaitable[R]]) -> Endpoint[P, R]: ...
@overload
def concurrent_endpoint(fn: Callable[Concatenate[Any, P], R]) -> Endpoint[P, R]: ...
@overload
def concurrent_endpoint(
    *, retry: bool = True
) -> Callable[[Callable[..., Any]], Endpoint[Any, Any]]: ...
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


class Options(Generic[A]):
    """How to spawn an actor class: made by ``Cls.options(...)``.

    Args:
        procs: procs per host.
        hosts: hosts (agents), one host slice each.
        replicas: for ``as_service()``: how many replicas (each ``hosts x procs``).
        name: the mesh name (default: the class name in lower case): 1-108
            letters, digits, ``_``, ``.`` or ``-``, without ``..`` (zmesh
            appends a suffix, and it names the procs' log files).
        service_config: for ``as_service()``: see ``zmesh.ServiceConfig``.

    Raises:
        ValueError: a size below 1, or a name that is not valid.
    """

    def __init__(
        self,
        cls: type[A],
        *,
        procs: int = 1,
        hosts: int = 1,
        replicas: int = 1,
        name: str | None = None,
        **service_config: Any,
    ) -> None:
        if procs < 1 or hosts < 1 or replicas < 1:
            raise ValueError(
                "procs, hosts and replicas must be at least 1, "
                f"got procs={procs} hosts={hosts} replicas={replicas}"
            )
        self.cls = cls
        self.procs = procs
        self.hosts = hosts
        self.replicas = replicas
        if name is None:  # a class name may hold any letter: keep the safe ones
            name = re.sub(r"[^A-Za-z0-9_.-]+|\.\.+", "_", cls.__name__.lower())[:100] or "actor"
        from zmesh._wire.messages import check_name

        # A service's replicas and every mesh add a suffix: leave room for it.
        self.name = check_name(name, "mesh name", reserve=20)
        self.service_config = service_config
        if service_config:
            from zmesh._service.routing import ServiceConfig

            ServiceConfig(**service_config)  # unknown or bad settings fail here, at once

    def as_actor(self, *args: Any, **kwargs: Any) -> ActorMesh[A]:
        """Spawn ``hosts x procs`` actors; their ``ActorMesh``, at once.

        The procs and actors start in the background: calls made meanwhile
        wait and go out in order, and ``await mesh`` (or
        ``mesh.initialized.get()``) waits until every ``__init__`` returned.

        Raises (from ``await mesh``, ``mesh.initialized`` and every call):
            SpawnError: a proc failed to start or ``__init__`` raised; nothing
                is left running.
        """
        from zmesh._client.spawning import spawn_actor_mesh

        if self.replicas != 1 or self.service_config:
            raise ValueError("replicas= and service settings are for as_service()")
        return spawn_actor_mesh(self, args, kwargs)

    def as_service(self, *args: Any, **kwargs: Any) -> Future[Service]:
        """Spawn ``replicas`` actor meshes as one self-healing ``Service``.

        Raises (from the future):
            SpawnError: a replica could not be started; nothing is left running.
        """
        from zmesh._service.service import spawn_service

        return spawn_service(self, args, kwargs)


class Actor:
    """Base class of actors. Subclass it and mark methods with ``@zmesh.endpoint``.

    An actor handles one message at a time, in send order per sender, unless
    an endpoint opts into ``concurrent=True``.

    Optional hooks: ``__supervise__(self, failure)`` (sync or async) gets each
    failure of a mesh this actor spawned (a truthy return handles it), and
    ``__cleanup__(self, exc)`` (sync or async) runs once when the actor stops.
    """

    @property
    def logger(self) -> logging.Logger:
        """A logger named after the class; in a proc its lines go to the proc's log."""
        return logging.getLogger(f"zmesh.actor.{type(self).__qualname__}")

    @classmethod
    def options(
        cls: type[A],
        *,
        procs: int = 1,
        hosts: int = 1,
        replicas: int = 1,
        name: str | None = None,
        **service_config: Any,
    ) -> Options[A]:
        """Say how to spawn this class; then ``.as_actor(...)`` or ``.as_service(...)``."""
        return Options(
            cls, procs=procs, hosts=hosts, replicas=replicas, name=name, **service_config
        )

"""What a service routes with: its settings, statistics, routers and sessions.

Plain classes with no sockets in them, so tests and custom routers can use
them directly.
"""

from __future__ import annotations

import contextvars
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from zmesh._shared.state import ReplicaState

if TYPE_CHECKING:
    from zmesh._service.service import Service

HEALTHY, RECOVERING, UNHEALTHY, STOPPED = (
    ReplicaState.HEALTHY, ReplicaState.RECOVERING, ReplicaState.UNHEALTHY, ReplicaState.STOPPED
)  # fmt: skip
UNREADY = ReplicaState.UNREADY
LATENCY_WINDOW = 60.0  # seconds of latencies behind p50/p99


@dataclass(frozen=True)
class ServiceConfig:
    """Settings of a service, given as ``Cls.options(replicas=..., **settings)``.

    Args:
        router: ``"round_robin"``, ``"least_loaded"`` or a ``Router``.
        max_concurrent_requests: requests in flight per replica.
        max_queue: requests waiting per replica (and, while no replica is
            healthy, per replica slot in the recovery queue).
        request_timeout: default timeout of a call, in seconds.
        return_rank: which rank's value ``call_one`` returns from a replica.
        health_interval: how often an ``__health__`` endpoint is polled.
        health_timeout: how long a health check may take; a check that takes
            longer counts against a replica only if it made no progress meanwhile.
        unready_timeout: how long a replica may stay ``UNREADY`` (failing its
            check, or answering nothing with work in flight) before it is replaced.
        max_restarts: restarts allowed within ``restart_window`` seconds;
            one more failure and the replica stays down.
        restart_window: see ``max_restarts``.
        backoff_initial: the first respawn delay; it doubles per failure.
        backoff_max: the longest respawn delay.
    """

    router: Any = "round_robin"
    max_concurrent_requests: int = 100
    max_queue: int = 1000
    request_timeout: float = 60.0
    return_rank: int = 0
    health_interval: float = 1.0
    health_timeout: float = 1.0
    unready_timeout: float = 30.0
    max_restarts: int = 5
    restart_window: float = 30.0
    backoff_initial: float = 0.1
    backoff_max: float = 5.0

    def __post_init__(self) -> None:
        if self.max_concurrent_requests < 1 or self.max_queue < 0:
            raise ValueError("max_concurrent_requests must be >= 1 and max_queue >= 0")
        if min(self.request_timeout, self.health_interval, self.health_timeout) <= 0 or (
            self.unready_timeout <= 0
        ):
            raise ValueError("timeouts and intervals must be positive")
        if self.max_restarts < 0 or self.restart_window <= 0:
            raise ValueError("max_restarts must be >= 0 and restart_window positive")
        make_router(self.router)  # fails here for an unknown router


class ReplicaStatistics(msgspec.Struct, frozen=True):
    """One replica, as ``Service.statistics()`` reports it."""

    index: int
    state: str
    generation: int
    in_flight: int
    queued: int
    completed: int
    failed: int
    retried: int
    restarts: int
    sent: int  # requests sent to the current generation
    sent_after_failure: int  # sent to a generation already known failed (stays 0)
    p50: float | None = None
    p99: float | None = None
    last_failure: str = ""


class ServiceStatistics(msgspec.Struct, frozen=True):
    """A service: ``state`` is OK (all healthy), DEGRADED (some) or DOWN (none)."""

    name: str
    state: str
    replicas: list[ReplicaStatistics]
    completed: int
    failed: int
    retried: int
    waiting: int


# ------------------------------------------------------------ routers


class Router:
    """Picks the replica for a request. Subclass it to route your way.

    ``choose`` gets the replicas that are healthy and can take work now and
    returns the ``index`` of one of them (``None``: any).
    """

    def choose(self, replicas: Sequence[ReplicaStatistics], session: str | None) -> int | None:
        raise NotImplementedError


class RoundRobinRouter(Router):
    """Each replica in turn, by replica index.

    It continues from the last replica it chose, not from a position in the
    healthy list, so a replica leaving or joining does not shift the turns
    of the others (Forge's index drifted when its healthy list changed).
    """

    def __init__(self) -> None:
        self._last = -1

    def choose(self, replicas: Sequence[ReplicaStatistics], session: str | None) -> int | None:
        if not replicas:
            return None
        after = [r.index for r in replicas if r.index > self._last]
        self._last = min(after) if after else min(r.index for r in replicas)
        return self._last


class LeastLoadedRouter(Router):
    """The replica with the fewest requests in flight plus queued."""

    def __init__(self) -> None:
        self._turn = itertools.count()

    def choose(self, replicas: Sequence[ReplicaStatistics], session: str | None) -> int | None:
        if not replicas:
            return None
        least = min(r.in_flight + r.queued for r in replicas)
        ties = [r.index for r in replicas if r.in_flight + r.queued == least]
        return ties[next(self._turn) % len(ties)]


def make_router(spec: Any) -> Router:
    if isinstance(spec, Router):
        return spec
    if spec == "round_robin":
        return RoundRobinRouter()
    if spec == "least_loaded":
        return LeastLoadedRouter()
    raise ValueError(f"unknown router {spec!r}: use 'round_robin', 'least_loaded' or a Router")


# ------------------------------------------------------------ sessions


_SESSION: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "zmesh_session", default=None
)


def current_session() -> Session | None:
    """The session the caller is in (``with svc.session():``), if any."""
    return _SESSION.get()


class Session:
    """Keeps calls on one replica: ``async with svc.session() as s:``.

    A session is bound to one *generation* of a replica (the state it keeps
    lives in that process). When that generation is gone (the replica died,
    even if it was respawned since), the next call moves the session to a
    healthy replica, counts it in ``rebinds`` and sets ``rebound``; a strict
    session (``svc.session(strict=True)``) raises ``SessionLostError`` on
    that call instead, so the caller knows its state is gone.

    Attributes:
        id: the session id.
        replica: the index of the bound replica, or ``None`` before the first call.
        generation: the bound replica's generation (0 before the first call).
        rebinds: how many times the session moved because its replica failed.
        rebound: whether it ever moved (its state on the replica was lost).
        strict: raise ``SessionLostError`` instead of moving silently.
    """

    def __init__(self, service: Service, session_id: str, strict: bool = False) -> None:
        self.service = service
        self.id = session_id
        self.strict = strict
        self.replica: int | None = None
        self.generation = 0
        self.rebinds = 0
        self.rebound = False
        self._tokens: list[contextvars.Token[Session | None]] = []

    def __enter__(self) -> Session:
        self._tokens.append(_SESSION.set(self))
        return self

    def __exit__(self, *exc: object) -> None:
        _SESSION.reset(self._tokens.pop())

    async def __aenter__(self) -> Session:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()

    def __repr__(self) -> str:
        return (
            f"<Session {self.id} replica={self.replica} generation={self.generation} "
            f"rebinds={self.rebinds}>"
        )


# Tracebacks, reprs and pickles name them where users import them (zmesh.routing).
for _cls in (LeastLoadedRouter, ReplicaStatistics, RoundRobinRouter, Router, ServiceStatistics):
    _cls.__module__ = "zmesh.routing"

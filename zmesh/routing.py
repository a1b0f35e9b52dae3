"""How a service chooses a replica, and what it reports: for custom routers.

``zmesh`` holds what every script uses (``ServiceConfig``, ``Session``,
``Service.statistics()``); this module holds the types a router is written
with, as ``trio.lowlevel`` holds trio's::

    from collections.abc import Sequence

    from zmesh.routing import ReplicaStatistics, Router

    class Fewest(Router):
        def choose(self, replicas: Sequence[ReplicaStatistics], session: str | None) -> int | None:
            return min(replicas, key=lambda r: r.in_flight).index if replicas else None

Pass one as ``Cls.options(replicas=4, router=Fewest())``.
"""

from zmesh._service.routing import (
    LeastLoadedRouter,
    ReplicaStatistics,
    RoundRobinRouter,
    Router,
    ServiceStatistics,
)

__all__ = [
    "LeastLoadedRouter",
    "ReplicaStatistics",
    "RoundRobinRouter",
    "Router",
    "ServiceStatistics",
]

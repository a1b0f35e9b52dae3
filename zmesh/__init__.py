"""zmesh: a broker-less actor fabric on ZeroMQ.

Spawn meshes of actor processes through a host agent on each node and call
their endpoints with adverbs::

    import zmesh

    class Counter(zmesh.Actor):
        def __init__(self, start: int = 0):
            self.n = start

        @zmesh.endpoint
        async def incr(self, by: int = 1) -> int:
            self.n += by
            return self.n

    mesh = await Counter.options(procs=4).as_actor()
    print(await mesh.incr.call(1))
"""

from zmesh._actor import Actor, Endpoint, Options, Point, current_rank, current_request, endpoint
from zmesh._adverbs import EndpointRef, Stream
from zmesh._controller import SupervisionEvent
from zmesh._errors import (
    ActorError,
    ActorStoppedError,
    AgentError,
    CallTimeoutError,
    EncodeError,
    EndpointError,
    SecurityError,
    ServiceError,
    ServiceOverloadedError,
    SpawnError,
    SupervisionError,
    ZmeshError,
)
from zmesh._future import Future
from zmesh._mesh import ActorMesh, HostMesh, MeshState, ProcMesh, ValueMesh, connect, this_host
from zmesh._routing import (
    LeastLoadedRouter,
    ReplicaStatistics,
    RoundRobinRouter,
    Router,
    ServiceConfig,
    ServiceStatistics,
    Session,
)
from zmesh._service import Service
from zmesh._service_endpoint import ServiceEndpoint
from zmesh._shutdown import shutdown
from zmesh._state import Rank, Status

__all__ = [
    "Actor",
    "ActorError",
    "ActorMesh",
    "ActorStoppedError",
    "AgentError",
    "CallTimeoutError",
    "EncodeError",
    "Endpoint",
    "EndpointError",
    "EndpointRef",
    "Future",
    "HostMesh",
    "LeastLoadedRouter",
    "MeshState",
    "Options",
    "Point",
    "ProcMesh",
    "Rank",
    "ReplicaStatistics",
    "RoundRobinRouter",
    "Router",
    "SecurityError",
    "Service",
    "ServiceConfig",
    "ServiceEndpoint",
    "ServiceError",
    "ServiceOverloadedError",
    "ServiceStatistics",
    "Session",
    "SpawnError",
    "Status",
    "Stream",
    "SupervisionError",
    "SupervisionEvent",
    "ValueMesh",
    "ZmeshError",
    "connect",
    "current_rank",
    "current_request",
    "endpoint",
    "shutdown",
    "this_host",
]

__version__ = "0.1.0"

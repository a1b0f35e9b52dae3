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

# Names load on first use (PEP 562): an actor proc or an agent imports only
# what it runs, which cut ~0.1 s (a third) off every proc's start. The
# mapping below is the public face; the imports under TYPE_CHECKING are the
# same names for type checkers and editors.
import importlib
import logging
from typing import TYPE_CHECKING, Any

from zmesh._actor import (
    Endpoint,
    Point,
    call_cancelled,
    concurrent_endpoint,
    current_rank,
    current_request,
    endpoint,
)
from zmesh._errors import (
    ActorError,
    ActorStoppedError,
    AgentError,
    AgentTimeoutError,
    CallTimeoutError,
    ConnectionLostError,
    DetachError,
    EncodeError,
    EndpointError,
    HandleTypeError,
    NameNotFoundError,
    OverloadedError,
    PortFullError,
    ResponsePortError,
    SecurityError,
    ServiceError,
    ServiceOverloadedError,
    SessionLostError,
    SpawnError,
    StreamInterruptedError,
    SupervisionError,
    ZmeshError,
)
from zmesh._options import Actor, Options, service

if TYPE_CHECKING:
    from zmesh import routing as routing
    from zmesh import testing as testing
    from zmesh._client.calls.future import Future
    from zmesh._client.calls.replies import Stream
    from zmesh._client.calls.values import ValueMesh
    from zmesh._client.control.controller import SupervisionEvent
    from zmesh._client.control.faults import MeshFailure, unhandled_fault_hook
    from zmesh._client.control.shutdown import shutdown
    from zmesh._client.handles.accumulate import Accumulator
    from zmesh._client.handles.adverbs import EndpointRef
    from zmesh._client.handles.hosts import HostMesh, connect, this_host
    from zmesh._client.handles.mesh import MeshState, ProcMesh
    from zmesh._client.ports.channels import Channel, Port, PortReceiver
    from zmesh._client.ports.portcalls import send
    from zmesh._client.ports.streams import ItemStream
    from zmesh._context import Context, context, current_actor_name, current_size
    from zmesh._lookup import lookup
    from zmesh._service.endpoint import ServiceEndpoint
    from zmesh._service.info import ServiceInfo, service_info
    from zmesh._service.routing import (
        ServiceConfig,
        Session,
    )
    from zmesh._shared.points import Extent
    from zmesh._shared.state import Rank, Status
    from zmesh._singletons import (
        get_or_spawn_controller,
        local_proc_mesh,
        proc_mesh,
        shutdown_context,
    )
    from zmesh._this_proc import this_proc

    # A handle is typed as its actor class (zmesh._typing): ActorMesh[Counter]
    # and Service[Counter] are Counter to a checker, the handle classes at run time.
    from zmesh._typing import ActorMesh, Service

_LAZY = {
    "Context": "zmesh._context",
    "context": "zmesh._context",
    "current_actor_name": "zmesh._context",
    "current_size": "zmesh._context",
    "send": "zmesh._client.ports.portcalls",
    "PortReceiver": "zmesh._client.ports.channels",
    "Port": "zmesh._client.ports.channels",
    "Channel": "zmesh._client.ports.channels",
    "ItemStream": "zmesh._client.ports.streams",
    "Accumulator": "zmesh._client.handles.accumulate",
    "EndpointRef": "zmesh._client.handles.adverbs",
    "Stream": "zmesh._client.calls.replies",
    "SupervisionEvent": "zmesh._client.control.controller",
    "Future": "zmesh._client.calls.future",
    "ActorMesh": "zmesh._client.handles.mesh",
    "HostMesh": "zmesh._client.handles.hosts",
    "MeshState": "zmesh._client.handles.mesh",
    "ProcMesh": "zmesh._client.handles.mesh",
    "ValueMesh": "zmesh._client.calls.values",
    "MeshFailure": "zmesh._client.control.faults",
    "unhandled_fault_hook": "zmesh._client.control.faults",
    "get_or_spawn_controller": "zmesh._singletons",
    "shutdown_context": "zmesh._singletons",
    "local_proc_mesh": "zmesh._singletons",
    "proc_mesh": "zmesh._singletons",
    "this_proc": "zmesh._this_proc",
    "Extent": "zmesh._shared.points",
    "connect": "zmesh._client.handles.hosts",
    "lookup": "zmesh._lookup",
    "this_host": "zmesh._client.handles.hosts",
    "ServiceConfig": "zmesh._service.routing",
    "Session": "zmesh._service.routing",
    "Service": "zmesh._service.service",
    "ServiceEndpoint": "zmesh._service.endpoint",
    "ServiceInfo": "zmesh._service.info",
    "service_info": "zmesh._service.info",
    "shutdown": "zmesh._client.control.shutdown",
    "Rank": "zmesh._shared.state",
    "Status": "zmesh._shared.state",
}


# The public submodules, by audience (as trio.lowlevel and trio.testing).
_SUBMODULES = {"routing", "testing"}


def __getattr__(name: str) -> Any:
    if name == "__version__":  # read on first use: importlib.metadata costs a proc's start
        from zmesh._version import version

        globals()[name] = value = version()
        return value
    if name in _SUBMODULES:  # zmesh.routing.Router after a plain `import zmesh`
        submodule = importlib.import_module(f"zmesh.{name}")
        globals()[name] = submodule
        return submodule
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'zmesh' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"__version__"})


__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "ActorStoppedError",
    "AgentError",
    "AgentTimeoutError",
    "CallTimeoutError",
    "Channel",
    "ConnectionLostError",
    "Context",
    "DetachError",
    "EncodeError",
    "Endpoint",
    "EndpointError",
    "EndpointRef",
    "Extent",
    "Future",
    "HandleTypeError",
    "HostMesh",
    "ItemStream",
    "MeshFailure",
    "MeshState",
    "NameNotFoundError",
    "Options",
    "OverloadedError",
    "Point",
    "Port",
    "PortFullError",
    "PortReceiver",
    "ProcMesh",
    "Rank",
    "ResponsePortError",
    "SecurityError",
    "Service",
    "ServiceConfig",
    "ServiceEndpoint",
    "ServiceError",
    "ServiceInfo",
    "ServiceOverloadedError",
    "Session",
    "SessionLostError",
    "SpawnError",
    "Status",
    "Stream",
    "StreamInterruptedError",
    "SupervisionError",
    "SupervisionEvent",
    "ValueMesh",
    "ZmeshError",
    "call_cancelled",
    "concurrent_endpoint",
    "connect",
    "context",
    "current_actor_name",
    "current_rank",
    "current_request",
    "current_size",
    "endpoint",
    "get_or_spawn_controller",
    "local_proc_mesh",
    "lookup",
    "proc_mesh",
    "send",
    "service",
    "service_info",
    "shutdown",
    "shutdown_context",
    "this_host",
    "this_proc",
    "unhandled_fault_hook",
]

# A library's loggers get no handler but this one: the application decides
# where zmesh's records go (logging.basicConfig(), or its own handlers).
logging.getLogger("zmesh").addHandler(logging.NullHandler())

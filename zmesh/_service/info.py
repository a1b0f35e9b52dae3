"""``zmesh.service_info(svc)``: a service's own name, id and config, typed.

A service handle is typed as its actor class (``zmesh._typing``), so the
checker sees the actor's attributes on it, not the handle's. The handle's
``name``, ``id`` and ``config`` are not declared there on purpose: actors
have attributes of those names themselves (``self.name``, ``self.config``),
and declaring the handle's would make each such actor a type error. Monarch
answers questions about the running system with functions
(``current_rank()``, ``context()``), and this does the same for a service.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from zmesh._client.handles.mesh import ActorMesh
from zmesh._errors import HandleTypeError
from zmesh._service.service import Service

if TYPE_CHECKING:
    from zmesh._actor import ActorBase
    from zmesh._service.routing import ServiceConfig


@dataclass(frozen=True)
class ServiceInfo:
    """What ``zmesh.service_info(svc)`` tells of a service.

    Attributes:
        name: the service's name (``options(name=...)``, or one zmesh chose).
        id: unique to this service, across every process that holds a handle.
        cls_name: the class of its actors.
        replicas: how many replicas it keeps (``len(svc)``).
        config: its ``ServiceConfig`` (queue bounds, timeouts, retries, health).
        detached: whether it outlives the script that made it (``detached=True``).
    """

    name: str
    id: str
    cls_name: str
    replicas: int
    config: ServiceConfig
    detached: bool


def service_info(svc: ActorBase) -> ServiceInfo:
    """The name, id and config of service ``svc`` (``await Cls.options(...).as_service()``).

    Example::

        svc = await Embedder.options(replicas=2, max_queue=64).as_service()
        info = zmesh.service_info(svc)
        print(info.name, info.config.max_queue)  # typed: str, int

    Raises:
        HandleTypeError: ``svc`` is not a service (an actor mesh, say).
    """

    if not isinstance(svc, Service):
        kind = "mesh" if _is_mesh(svc) else type(svc).__name__
        raise HandleTypeError(
            f"zmesh.service_info() takes a service, not a {kind} "
            f"(of {getattr(svc, 'cls_name', type(svc).__qualname__)})",
            kind=kind, found=getattr(svc, "cls_name", ""), expected="a service",
            mesh=getattr(svc, "proc_mesh", None),
        )  # fmt: skip
    return ServiceInfo(
        name=svc.name, id=svc.id, cls_name=svc.cls_name, replicas=len(svc), config=svc.config,
        detached=svc._detached is not None,
    )  # fmt: skip


def _is_mesh(x: object) -> bool:
    return isinstance(x, ActorMesh)

"""What a type checker sees of ``zmesh.lookup`` and ``zmesh.service_info``.

mypy checks it (tests/test_quality.py); nothing here runs. ``lookup(name,
Cls)`` is typed as ``Cls`` (a service or a mesh, as ``as_service()`` and
``as_actor()`` are); a service's own name, id and config are read with
``service_info``, which leaves actors free to have attributes of those names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import zmesh
from zmesh import Future, ServiceConfig, ServiceInfo

if TYPE_CHECKING:
    from typing_extensions import assert_type


class Tables(zmesh.Actor):
    def __init__(self, name: str) -> None:
        self.name = name  # an actor's own `name`: no clash with the service's
        self.config = {"rows": 10}  # nor its own `config`

    @zmesh.endpoint
    async def row(self, i: int) -> list[str]:
        return [self.name] * i


async def lookups() -> None:
    assert_type(zmesh.lookup("tables"), Future[Any])
    assert_type(zmesh.lookup("tables", Tables), Future[Tables])
    svc = await zmesh.lookup("tables", Tables)
    assert_type(svc, Tables)
    assert_type(svc.row(2), Future[list[str]])
    assert_type(svc.row.choose(1), Future[list[str]])
    assert_type(zmesh.lookup("tables", Tables).get(timeout=10), Tables)
    svc.row("x")  # type: ignore[arg-type]
    zmesh.lookup("tables", int)  # type: ignore[type-var]
    zmesh.lookup(Tables)  # type: ignore[call-overload]


async def infos() -> None:
    svc = await Tables.options(replicas=2).as_service("t")
    info = zmesh.service_info(svc)
    assert_type(info, ServiceInfo)
    assert_type(info.name, str)
    assert_type(info.id, str)
    assert_type(info.config, ServiceConfig)
    assert_type(info.config.max_queue, int)
    assert_type(info.replicas, int)
    assert_type(info.detached, bool)
    info.name = "other"  # type: ignore[misc]
    zmesh.service_info("tables")  # type: ignore[arg-type]


def named(svc: zmesh.Service[Tables]) -> None:
    assert_type(zmesh.service_info(svc).cls_name, str)

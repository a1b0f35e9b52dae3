"""What a type checker sees of services. mypy checks it (tests/test_quality.py).

A service is typed as its actor class, as a mesh is. Nothing here runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import zmesh
from zmesh import Future, Session
from zmesh.routing import ServiceStatistics

if TYPE_CHECKING:
    from typing_extensions import assert_type


@zmesh.service(replicas=2, max_queue=100)
class Embedder(zmesh.Actor):
    @zmesh.endpoint
    async def embed(self, text: str) -> list[float]:
        return [float(len(text))]

    @zmesh.endpoint(retry=False)
    def charge(self, cents: int) -> bool:
        return cents > 0


async def services() -> None:
    svc = await Embedder.options().spawn()
    assert_type(svc, Embedder)
    assert_type(await Embedder.options(replicas=3).as_service(), Embedder)
    assert_type(Embedder.options().as_service(), Future[Embedder])
    assert_type(svc.embed("hi"), Future[list[float]])  # a direct call: one replica
    assert_type(await svc.embed("hi"), list[float])
    assert_type(svc.embed.call_one("hi"), Future[list[float]])
    assert_type(svc.embed.choose("hi"), Future[list[float]])
    assert_type(svc.charge.options(timeout=2.0, session="user-1").call_one(5), Future[bool])
    async for reply in svc.charge.stream(1):
        assert_type(reply, bool)
    assert_type(svc.session("user-1"), Session)
    assert_type(svc.statistics(), ServiceStatistics)
    assert_type(svc.replica(0), Embedder | None)
    assert_type(svc.stop(), Future[None])
    svc.embed(3)  # type: ignore[arg-type]
    svc.embed.call_one(b"hi")  # type: ignore[arg-type]
    svc.charge()  # type: ignore[call-arg]


def named(svc: zmesh.Service[Embedder]) -> None:
    assert_type(svc, Embedder)  # Service[Embedder] is Embedder to a checker
    assert_type(svc.embed("x").get(timeout=5), list[float])

"""``zmesh.lookup(name, Cls)`` checks what it found; ``zmesh.service_info(svc)``.

A detached service and a detached mesh on a keyed loopback agent, made and
looked up by this process.
"""

from __future__ import annotations

import asyncio

import pytest

import zmesh

from _helpers import connected


class Tables(zmesh.Actor):
    def __init__(self, name: str) -> None:
        self.name = name  # an actor's own name, as Monarch actors often have

    @zmesh.endpoint
    def row(self, i: int) -> str:
        return f"{self.name}:{i}"


class Chairs(zmesh.Actor):
    @zmesh.endpoint
    def row(self, i: int) -> str:
        return str(i)


class Tables2(Tables):
    @zmesh.endpoint
    def column(self) -> str:
        return "c"


Tables2.__qualname__ = "Tables"  # another class of the same name, with one more endpoint


def test_lookup_with_a_class_checks_it_and_service_info_reads_the_service(
    keyed_agent: tuple[str, str],
) -> None:
    control, keys = keyed_agent
    with connected([control], keys=keys):
        svc = Tables.options(name="t-svc", replicas=2, max_queue=7, detached=True).spawn("s")
        made = svc.get(timeout=60)
        mesh = Tables.options(name="t-mesh", procs=1, detached=True).as_actor("m")
        mesh.initialized.get(timeout=60)
        try:
            found = zmesh.lookup("t-svc", Tables).get(timeout=30)
            assert found.row(1).get(timeout=10) == "s:1"
            info = zmesh.service_info(found)
            assert info == zmesh.service_info(made)
            assert (info.name, info.cls_name, info.replicas, info.detached) == (
                "t-svc", "Tables", 2, True,
            )  # fmt: skip
            assert info.config.max_queue == 7 and info.id
            assert zmesh.lookup("t-mesh", Tables).get(timeout=30).row.call_one(2).get(10) == "m:2"

            async def attach() -> Tables:  # awaited, in an event loop of its own
                return await zmesh.lookup("t-mesh", Tables)

            assert asyncio.run(attach()).row.call_one(3).get(timeout=10) == "m:3"

            with pytest.raises(zmesh.HandleTypeError) as wrong:
                zmesh.lookup("t-svc", Chairs).get(timeout=30)
            err = wrong.value
            assert isinstance(err, TypeError)
            assert (err.name, err.kind, err.found, err.expected) == (
                "t-svc", "service", "Tables", "Chairs",
            )  # fmt: skip
            assert "'t-svc' is a service of Tables, not of Chairs" in str(err)
            assert "mesh=t-svc" in str(err)
            other = "'t-mesh' is a mesh of another Tables: no endpoint column"
            with pytest.raises(zmesh.HandleTypeError, match=other):
                zmesh.lookup("t-mesh", Tables2).get(timeout=30)
            with pytest.raises(zmesh.HandleTypeError, match="must be an actor class"):
                zmesh.lookup("t-mesh", "Tables")  # type: ignore[call-overload]
            with pytest.raises(zmesh.HandleTypeError, match="takes a service, not a mesh") as e:
                zmesh.service_info(mesh)
            assert e.value.found == "Tables"
            with pytest.raises(zmesh.NameNotFoundError):
                zmesh.lookup("t-none", Tables).get(timeout=30)
        finally:
            made.stop().get(timeout=30)
            mesh.stop().get(timeout=30)

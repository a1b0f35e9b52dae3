"""Every adverb on a 2x2 mesh over two loopback agents (the ``cluster`` fixture)."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

import zmesh
from zmesh.testing import AgentProcess

from integration._fabric import Notebook


class Placed(Notebook):
    def __init__(self) -> None:
        self.notes: list[str] = []

    @zmesh.endpoint
    def where(self) -> tuple[int, dict[str, int], int]:
        p = zmesh.current_rank()
        return p.rank, p.coords, os.getppid()


def expected(agents: list[AgentProcess]) -> list[tuple[int, dict[str, int], int]]:
    # Host h's procs are children of agent h.
    return [
        (h * 2 + p, {"hosts": h, "procs": p}, agents[h].pid) for h in range(2) for p in range(2)
    ]


def test_every_adverb_on_two_agents(cluster: list[AgentProcess]) -> None:
    # One cluster, one mesh: sync checks here, async ones in a loop of their own.
    mesh = Placed.options(hosts=2, procs=2).as_actor().get(timeout=60)
    assert mesh.sizes == {"hosts": 2, "procs": 2}
    assert len(mesh) == 4
    want = expected(cluster)

    assert mesh.where.call().get(timeout=10).values() == want
    with pytest.raises(ValueError):
        mesh.slice(hosts=0).where.call_one()
    assert mesh.slice(hosts=0, procs=1).where.call_one().get(timeout=10) == want[1]

    token = uuid.uuid4().hex
    mesh.note.broadcast(token)
    assert all(token in s for s in mesh.seen.call().get(timeout=10).values())

    assert mesh.where.choose().get(timeout=10) in want
    assert sorted(mesh.where.stream()) == want

    asyncio.run(every_adverb_async(mesh, want))
    mesh.stop().get(timeout=10)


async def every_adverb_async(
    mesh: zmesh.ActorMesh[Placed], want: list[tuple[int, dict[str, int], int]]
) -> None:
    vm = await mesh.where.call()
    assert vm.values() == want
    assert [(p.rank, p.coords) for p, _ in vm.items()] == [(r, c) for r, c, _ in want]

    with pytest.raises(ValueError):
        mesh.where.call_one()
    assert await mesh.slice(hosts=1, procs=0).where.call_one() == want[2]

    token = uuid.uuid4().hex
    assert mesh.note.broadcast(token) is None  # type: ignore[func-returns-value]
    assert all(token in s for s in (await mesh.seen.call()).values())

    chosen = {(await mesh.where.choose())[0] for _ in range(8)}
    assert chosen == {0, 1, 2, 3}

    assert sorted([v async for v in mesh.where.stream()]) == want

"""Reductions: ``Accumulator`` folds a mesh call's replies as they arrive;
``ValueMesh.reduce`` folds a call's values in rank order."""

from __future__ import annotations

import operator
from collections.abc import AsyncIterator

import pytest

import zmesh

pytestmark = pytest.mark.anyio


class Scalar(zmesh.Actor):
    @zmesh.endpoint
    async def value(self, scale: int = 1) -> int:
        p = zmesh.current_rank()
        return scale * (10 * p["hosts"] + p["procs"] + 1)

    @zmesh.endpoint
    async def fail_on(self, rank: int) -> int:
        if zmesh.current_rank().rank == rank:
            raise RuntimeError(f"rank {rank} refuses")
        return 1


@pytest.fixture
async def mesh() -> AsyncIterator[zmesh.ActorMesh[Scalar]]:
    m = await Scalar.options(hosts=2, procs=4).as_actor()  # 2x4, on two local agents
    yield m
    await m.stop()


async def test_accumulate_over_a_2x4_mesh_equals_the_local_fold(
    mesh: zmesh.ActorMesh[Scalar],
) -> None:
    values = (await mesh.value.call(3)).values()
    assert len(values) == 8
    total = await zmesh.Accumulator(mesh.value, 0, operator.add).accumulate(3)
    assert total == sum(values)
    seen: frozenset[int] = await zmesh.Accumulator(
        mesh.value, frozenset[int](), lambda s, v: s | {v}
    ).accumulate(scale=2)
    assert seen == {2 * v for v in (await mesh.value.call(1)).values()}
    half = mesh.slice(hosts=1)
    assert await zmesh.Accumulator(half.value, 0, operator.add).accumulate() == sum(
        (await half.value.call()).values()
    )


async def test_value_mesh_reduce_folds_in_rank_order(mesh: zmesh.ActorMesh[Scalar]) -> None:
    vm = await mesh.value.call()
    assert vm.reduce(operator.add) == sum(vm.values())
    assert vm.reduce(lambda acc, v: [*acc, v], initial=list[int]()) == vm.values()


async def test_a_failing_rank_fails_the_accumulation(mesh: zmesh.ActorMesh[Scalar]) -> None:
    with pytest.raises(zmesh.ActorError, match="rank 5 refuses") as info:
        await zmesh.Accumulator(mesh.fail_on, 0, operator.add).accumulate(5)
    assert info.value.rank == 5


def test_accumulate_from_sync_code() -> None:
    m = Scalar.options(procs=4).as_actor().get(timeout=60)
    try:
        acc = zmesh.Accumulator(m.value, 0, operator.add)
        assert acc.accumulate().get(timeout=10) == 1 + 2 + 3 + 4
        with pytest.raises(ZeroDivisionError):
            zmesh.Accumulator(m.value, 0, lambda a, v: v // 0).accumulate().get(timeout=10)
    finally:
        m.stop().get(timeout=10)

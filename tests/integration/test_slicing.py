"""Slicing a mesh by named dims: sizes, len, ranks, and what the actors say they are."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import zmesh

from _keptagents import stop_meshes


class Where(zmesh.Actor):
    @zmesh.endpoint
    def where(self) -> tuple[int, dict[str, int], dict[str, int]]:
        p = zmesh.current_rank()
        return p.rank, p.coords, dict(p.dims)


@pytest.fixture(autouse=True)
def _stop_everything() -> Iterator[None]:
    yield  # the module mesh outlives single tests; the fixture below stops it


@pytest.fixture(scope="module")
def mesh() -> Iterator[zmesh.ActorMesh[Where]]:
    # 2 hosts (two embedded agents) x 3 procs: ranks 0..5, rank = 3*host + proc.
    m = Where.options(hosts=2, procs=3).as_actor().get(timeout=60)
    yield m
    stop_meshes()


FULL = {"hosts": 2, "procs": 3}


def ranks_of(view: zmesh.ActorMesh[Where]) -> list[int]:
    """The ranks the actors of ``view`` report, in the order ``call`` returns them."""
    values = view.where.call().get(timeout=10).values()
    for rank, coords, dims in values:
        assert dims == FULL  # an actor's point is in the full mesh, sliced or not
        assert coords == {"hosts": rank // 3, "procs": rank % 3}
    return [rank for rank, _, _ in values]


def test_full_mesh(mesh: zmesh.ActorMesh[Where]) -> None:
    assert mesh.sizes == FULL
    assert len(mesh) == 6
    assert ranks_of(mesh) == [0, 1, 2, 3, 4, 5]


def test_slice_keeps_sliced_dims_and_drops_indexed_ones(mesh: zmesh.ActorMesh[Where]) -> None:
    view = mesh.slice(hosts=0, procs=slice(0, 2))
    assert view.sizes == {"procs": 2}
    assert len(view) == 2
    assert ranks_of(view) == [0, 1]

    second_host = mesh.slice(hosts=1)
    assert second_host.sizes == {"procs": 3}
    assert len(second_host) == 3
    assert ranks_of(second_host) == [3, 4, 5]

    last_proc = mesh.slice(procs=2)
    assert last_proc.sizes == {"hosts": 2}
    assert ranks_of(last_proc) == [2, 5]

    keep_both = mesh.slice(hosts=slice(1, 2), procs=slice(1, 3))
    assert keep_both.sizes == {"hosts": 1, "procs": 2}
    assert ranks_of(keep_both) == [4, 5]


def test_int_indices_give_one_actor(mesh: zmesh.ActorMesh[Where]) -> None:
    one = mesh.slice(hosts=1, procs=2)
    assert one.sizes == {}
    assert len(one) == 1
    rank, coords, dims = one.where.call_one().get(timeout=10)
    assert (rank, coords, dims) == (5, {"hosts": 1, "procs": 2}, FULL)


def test_negative_and_stepped_slices(mesh: zmesh.ActorMesh[Where]) -> None:
    assert ranks_of(mesh.slice(procs=-1)) == [2, 5]
    assert ranks_of(mesh.slice(hosts=-1, procs=-3)) == [3]
    stepped = mesh.slice(procs=slice(None, None, 2))
    assert stepped.sizes == {"hosts": 2, "procs": 2}
    assert ranks_of(stepped) == [0, 2, 3, 5]


def test_slice_of_a_slice(mesh: zmesh.ActorMesh[Where]) -> None:
    host1 = mesh.slice(hosts=1)
    tail = host1.slice(procs=slice(1, 3))
    assert tail.sizes == {"procs": 2}
    assert ranks_of(tail) == [4, 5]
    assert ranks_of(tail.slice(procs=0)) == [4]


def test_value_mesh_points_of_a_slice(mesh: zmesh.ActorMesh[Where]) -> None:
    view = mesh.slice(procs=slice(1, 3))
    vm = view.where.call().get(timeout=10)
    assert [p.rank for p, _ in vm.items()] == [1, 2, 4, 5]
    for point, (rank, coords, _) in vm.items():
        # The point a caller sees is the one current_rank() gives the actor.
        assert point.rank == rank
        assert point.coords == coords
    assert [p.rank for p in view.points()] == [1, 2, 4, 5]


@pytest.mark.anyio
async def test_slices_work_from_async_code(mesh: zmesh.ActorMesh[Where]) -> None:
    view = mesh.slice(hosts=0, procs=slice(0, 2))
    vm = await view.where.call()
    assert [r for r, _, _ in vm.values()] == [0, 1]
    assert sorted([r async for r, _, _ in view.where.stream()]) == [0, 1]


def test_bad_slices(mesh: zmesh.ActorMesh[Where]) -> None:
    with pytest.raises(ValueError, match="gpus"):
        mesh.slice(gpus=0)
    with pytest.raises(IndexError):
        mesh.slice(procs=3)
    with pytest.raises(IndexError):
        mesh.slice(hosts=-3)
    # An empty slice is a mesh of no actors, not an error of the call.
    empty = mesh.slice(procs=slice(3, 3))
    assert len(empty) == 0
    assert empty.where.call().get(timeout=10).values() == []


def test_current_rank_outside_an_actor_raises() -> None:
    with pytest.raises(RuntimeError):
        zmesh.current_rank()

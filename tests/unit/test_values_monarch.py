"""ValueMesh.slice and str(Point) as Monarch has them (pure, no procs)."""

from __future__ import annotations

import pytest

from zmesh import Point, ValueMesh


def _vm() -> ValueMesh[str]:
    dims = {"hosts": 2, "gpus": 3}
    points = [Point(r, dims) for r in range(6)]
    return ValueMesh(dims, points, [f"v{r}" for r in range(6)])


def test_value_mesh_slice_picks_as_mesh_slice_does() -> None:
    vm = _vm()
    one = vm.slice(hosts=1)
    assert one.sizes == {"gpus": 3} and one.values() == ["v3", "v4", "v5"]
    assert one.slice(gpus=2).item() == "v5"
    kept = vm.slice(gpus=slice(1, 3))
    assert kept.sizes == {"hosts": 2, "gpus": 2} and kept.values() == ["v1", "v2", "v4", "v5"]
    assert [p.rank for p in kept.points()] == [1, 2, 4, 5]  # points stay the full mesh's
    assert vm.flatten("r").slice(r=4).item() == "v4"
    assert vm.slice(gpus=-1).values() == ["v2", "v5"]
    with pytest.raises(KeyError, match="unknown dims"):
        vm.slice(procs=0)
    with pytest.raises(IndexError, match="out of range"):
        vm.slice(gpus=3)


def test_a_point_prints_as_monarch_prints_it() -> None:
    point = Point(4, {"hosts": 2, "gpus": 3})
    assert str(point) == "{'hosts': 1/2, 'gpus': 1/3}"
    assert repr(point) == "Point(rank=4, hosts=1, gpus=1)"

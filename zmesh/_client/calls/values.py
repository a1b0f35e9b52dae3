"""``ValueMesh``: the replies of a ``call``, one per actor, laid out as the mesh.

As in Monarch: iterating yields ``(Point, value)`` pairs, ``vm.item(**coords)``
picks one value, ``vm.values()`` lists them in rank order. A value's point
is its actor's point in the full mesh that was spawned (for a call on a
slice too); ``item`` takes coordinates within the mesh that was called.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar, overload

from zmesh._shared.points import Extent, Point

T = TypeVar("T")
A = TypeVar("A")


_NO_INITIAL: Any = object()


class ValueMesh(Generic[T]):
    """The values of a ``call``, one per actor, in rank order.

    Args:
        dims: the called mesh's dims and sizes.
        points: each actor's point in the full mesh, in rank order.
        values: the values, in the same order.
    """

    def __init__(self, dims: dict[str, int], points: list[Point], values: list[T]) -> None:
        self.dims = dims
        self._points = points
        self._values = values

    @property
    def sizes(self) -> dict[str, int]:
        """Size of each dim."""
        return dict(self.dims)

    @property
    def extent(self) -> Extent:
        """The shape: an ordered mapping of dim to size."""
        return Extent(self.dims)

    def size(self, dim: str | Iterable[str] | None = None) -> int:
        """How many values: in all, along ``dim``, or along several dims."""
        if dim is None:
            return len(self._values)
        if isinstance(dim, str):
            return self.dims[dim]
        return math.prod(self.dims[d] for d in dim)

    def values(self) -> list[T]:
        """The values in rank order."""
        return list(self._values)

    def items(self) -> list[tuple[Point, T]]:
        """``(point, value)`` pairs in rank order; each point in the full mesh."""
        return list(zip(self._points, self._values, strict=True))

    def item(self, **coords: int) -> T:
        """The value at ``coords`` (every dim of this mesh; none for a one-value mesh).

        Raises:
            KeyError: a dim is missing or unknown.
            IndexError: a coordinate is out of range.
        """
        if set(coords) != set(self.dims):
            raise KeyError(f"item() needs exactly the dims {list(self.dims)}, got {list(coords)}")
        rank = 0
        for name, size in self.dims.items():
            c = coords[name]
            if not 0 <= c < size:
                raise IndexError(f"{name}={c} is out of range for size {size}")
            rank = rank * size + c
        return self._values[rank]

    def flatten(self, name: str) -> ValueMesh[T]:
        """The same values on one dim ``name``."""
        return ValueMesh({name: len(self._values)}, self._points, self._values)

    def slice(self, **sel: int | slice) -> ValueMesh[T]:
        """Some of the values, as ``mesh.slice`` picks actors: an int drops its
        dim, a ``slice`` keeps it (``vm.slice(gpus=0).item()``, as in Monarch).

        Raises:
            KeyError: an unknown dim.
            IndexError: an index out of range.
        """
        unknown = set(sel) - set(self.dims)
        if unknown:
            raise KeyError(f"slice(): unknown dims {sorted(unknown)}; dims are {list(self.dims)}")
        picks: dict[str, list[int]] = {}
        for name, size in self.dims.items():
            want = sel.get(name, slice(None))
            if isinstance(want, slice):
                picks[name] = list(range(size))[want]
            elif -size <= want < size:
                picks[name] = [want % size]
            else:
                raise IndexError(f"{name}={want} is out of range for size {size}")
        dims = {n: len(picks[n]) for n in self.dims if not isinstance(sel.get(n), int)}
        ranks = [0]
        for name, size in self.dims.items():
            ranks = [r * size + c for r in ranks for c in picks[name]]
        return ValueMesh(dims, [self._points[r] for r in ranks], [self._values[r] for r in ranks])

    def points(self) -> list[Point]:
        """Each value's point in the full mesh that was spawned, in rank order."""
        return list(self._points)

    @overload
    def reduce(self, fn: Callable[[T, T], T]) -> T: ...
    @overload
    def reduce(self, fn: Callable[[A, T], A], initial: A) -> A: ...
    def reduce(self, fn: Callable[[Any, T], Any], initial: Any = _NO_INITIAL) -> Any:
        """Fold the values in rank order: ``fn(...fn(initial, v0)..., vN)``.

        Without ``initial`` the first value starts the fold (an empty mesh
        then raises ``TypeError``, as ``functools.reduce`` does).
        """
        if initial is _NO_INITIAL:
            return functools.reduce(fn, self._values)
        return functools.reduce(fn, self._values, initial)

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[tuple[Point, T]]:
        return iter(self.items())

    def __getitem__(self, index: int) -> T:
        return self._values[index]

    def __repr__(self) -> str:
        return f"ValueMesh({self.dims}, {self._values!r})"

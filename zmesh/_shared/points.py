"""Where actors sit: ``Extent`` (the shape of a mesh) and ``Point`` (one place in it).

Both are read-only mappings, as in Monarch: an ``Extent`` maps each dim to
its size, a ``Point`` each dim to its coordinate, so ``mesh.slice(**point)``
picks the actor at a point. Ranks are row-major, the last dim fastest.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class Extent(Mapping[str, int]):
    """The size of each dim of a mesh, in order: ``{"hosts": 2, "gpus": 4}``.

    Args:
        labels: the dims, or a mapping of dim to size.
        sizes: the sizes, when ``labels`` is a sequence of names.
    """

    __slots__ = ("_dims",)

    def __init__(
        self, labels: Mapping[str, int] | Sequence[str], sizes: Sequence[int] = ()
    ) -> None:
        if isinstance(labels, Mapping):
            self._dims = dict(labels)
        else:
            if len(labels) != len(sizes):
                raise ValueError(f"{len(labels)} labels but {len(sizes)} sizes")
            self._dims = dict(zip(labels, sizes, strict=True))

    @property
    def labels(self) -> list[str]:
        """The dims, in order."""
        return list(self._dims)

    @property
    def sizes(self) -> list[int]:
        """The size of each dim, in order."""
        return list(self._dims.values())

    @property
    def nelements(self) -> int:
        """How many points: the product of the sizes."""
        return math.prod(self._dims.values())

    def __getitem__(self, dim: str) -> int:
        return self._dims[dim]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dims)

    def __len__(self) -> int:
        return len(self._dims)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return list(self.items()) == list(other.items())
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self._dims.items()))

    def __repr__(self) -> str:
        return f"Extent({self._dims})"


@dataclass(frozen=True, eq=True)
class Point(Mapping[str, int]):
    """Where an actor sits in its mesh: a flat ``rank`` and a coordinate per dim.

    A mapping of dim to coordinate (``point["procs"]``, ``dict(point)``,
    ``mesh.slice(**point)``); ``point.procs`` and ``point.coords`` too.

    Args:
        rank: the flat, row-major rank in the mesh.
        dims: the mesh's dims and sizes (an ``Extent`` or a dict).
    """

    rank: int
    dims: Mapping[str, int]

    @property
    def extent(self) -> Extent:
        """The shape of the mesh this point is in."""
        return Extent(self.dims)

    @property
    def coords(self) -> dict[str, int]:
        coords: dict[str, int] = {}
        rest = self.rank
        for name, size in reversed(list(self.dims.items())):
            coords[name] = rest % size
            rest //= size
        return dict(reversed(list(coords.items())))

    def size(self, dim: str | None = None) -> int:
        """The size of ``dim`` in the mesh (of the whole mesh when ``None``)."""
        return math.prod(self.dims.values()) if dim is None else self.dims[dim]

    def __getitem__(self, dim: str) -> int:
        return self.coords[dim]

    def __iter__(self) -> Iterator[str]:
        return iter(self.dims)

    def __len__(self) -> int:
        return len(self.dims)

    def __getattr__(self, dim: str) -> int:
        if dim.startswith("__"):
            raise AttributeError(dim)
        try:
            return self.coords[dim]
        except KeyError:
            raise AttributeError(dim) from None

    def __hash__(self) -> int:
        return hash((self.rank, tuple(self.dims.items())))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in self.coords.items())
        return f"Point(rank={self.rank}, {inner})"

    def label(self) -> str:
        """The point as Monarch prints it (``str(point)``): ``{'hosts': 0/1, 'gpus': 1/2}``."""
        inner = ", ".join(f"{k!r}: {v}/{self.dims[k]}" for k, v in self.coords.items())
        return "{" + inner + "}"

    __str__ = label


def check_per_proc(per_proc: Any) -> int:
    """``actors_per_proc``, checked.

    Raises:
        TypeError: it is not an int.
        ValueError: it is below 1.
    """
    if isinstance(per_proc, bool) or not isinstance(per_proc, int):
        raise TypeError(f"actors_per_proc must be an int (at least 1), not {per_proc!r}")
    if per_proc < 1:
        raise ValueError(f"actors_per_proc must be at least 1, got {per_proc}")
    return per_proc


class Shape:
    """Named dims over a list of flat ranks (a full mesh or a slice of one)."""

    def __init__(self, dims: dict[str, int], ranks: list[int]) -> None:
        self.dims = dict(dims)
        self.ranks = list(ranks)

    def sliced(self, sel: dict[str, int | slice]) -> Shape:
        for name in sel:
            if name not in self.dims:
                raise ValueError(f"no dimension {name!r} (dims: {list(self.dims)})")
        names = list(self.dims)
        # Coordinates of each position of this view, row-major.
        keep_dims: dict[str, int] = {}
        picks: dict[str, list[int]] = {}
        for name in names:
            size = self.dims[name]
            s = sel.get(name, slice(None))
            if isinstance(s, int):
                if not -size <= s < size:
                    raise IndexError(f"{name}={s} is out of range for size {size}")
                picks[name] = [s % size]
            else:
                picks[name] = list(range(size))[s]
                keep_dims[name] = len(picks[name])
        out: list[int] = []
        strides = {n: math.prod(self.dims[m] for m in names[i + 1 :]) for i, n in enumerate(names)}

        def walk(i: int, offset: int) -> None:
            if i == len(names):
                out.append(self.ranks[offset])
                return
            n = names[i]
            for c in picks[n]:
                walk(i + 1, offset + c * strides[n])

        walk(0, 0)
        return Shape(keep_dims, out)

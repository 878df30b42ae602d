"""Mesh shapes, slicing and ``ValueMesh``: pure logic, no processes.

A mesh is an ordered set of *points* laid out row-major over named dimensions,
e.g. ``{"procs": 4}`` or ``{"hosts": 2, "gpus": 8}``. ``slice(procs=2)`` keeps one
index and drops the dimension; ``slice(procs=slice(0, 2))`` keeps a range and the
dimension. Ranks are positions within the (sliced) mesh, in row-major order.
"""

from __future__ import annotations

import itertools
from typing import Any, Generic, Iterator, Sequence, TypeVar

T = TypeVar("T")


class Shape:
    """Named dimensions with sizes, and the flat indices (into a parent list of points) they select."""

    __slots__ = ("names", "sizes", "indices")

    def __init__(self, dims: dict[str, int], indices: Sequence[int] | None = None):
        for name, size in dims.items():
            if not isinstance(size, int) or size < 1:
                raise ValueError(f"mesh dimension {name!r} must be a positive int, got {size!r}")
        self.names = tuple(dims)
        self.sizes = tuple(dims.values())
        n = 1
        for s in self.sizes:
            n *= s
        self.indices = tuple(range(n)) if indices is None else tuple(indices)
        if len(self.indices) != n:
            raise ValueError(f"shape {dims} holds {n} points but {len(self.indices)} indices were given")

    @property
    def dims(self) -> dict[str, int]:
        return dict(zip(self.names, self.sizes))

    def __len__(self) -> int:
        return len(self.indices)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shape) and (self.names, self.sizes, self.indices) == (
            other.names, other.sizes, other.indices)

    def __repr__(self) -> str:
        return f"Shape({self.dims})"

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinates of ``rank`` (row-major)."""
        if not 0 <= rank < len(self):
            raise IndexError(f"rank {rank} out of range for a mesh of {len(self)}")
        out: dict[str, int] = {}
        for name, size in zip(reversed(self.names), reversed(self.sizes)):
            rank, out[name] = divmod(rank, size)
        return dict(reversed(list(out.items())))

    def rank_of(self, coords: dict[str, int] | Sequence[int]) -> int:
        if not isinstance(coords, dict):
            coords = dict(zip(self.names, coords))
        if set(coords) != set(self.names):
            raise KeyError(f"coordinates {coords} must name exactly the dimensions {list(self.names)}")
        rank = 0
        for name, size in zip(self.names, self.sizes):
            c = coords[name]
            if not 0 <= c < size:
                raise IndexError(f"coordinate {name}={c} out of range 0..{size - 1}")
            rank = rank * size + c
        return rank

    def slice(self, **sel: int | slice) -> "Shape":
        """A sub-shape; ``int`` drops the dimension, ``slice`` keeps it. Unknown names are an error."""
        unknown = set(sel) - set(self.names)
        if unknown:
            raise KeyError(f"no dimension {sorted(unknown)} in mesh with dimensions {list(self.names)}")
        ranges: list[list[int]] = []
        dims: dict[str, int] = {}
        for name, size in zip(self.names, self.sizes):
            s = sel.get(name, slice(None))
            if isinstance(s, int):
                if not -size <= s < size:
                    raise IndexError(f"{name}={s} out of range for size {size}")
                ranges.append([s % size])
            elif isinstance(s, slice):
                r = list(range(size))[s]
                if not r:
                    raise IndexError(f"{name}={s} selects nothing from size {size}")
                ranges.append(r)
                dims[name] = len(r)
            else:
                raise TypeError(f"slice {name}= takes an int or a slice, got {type(s).__name__}")
        flat: list[int] = []
        for combo in itertools.product(*ranges):
            rank = 0
            for c, size in zip(combo, self.sizes):
                rank = rank * size + c
            flat.append(self.indices[rank])
        return Shape(dims, flat)


class NamedMesh:
    """What proc meshes and actor meshes share: a name and a (possibly sliced) shape."""

    _name: str
    _shape: Shape

    @property
    def name(self) -> str:
        return self._name

    @property
    def shape(self) -> dict[str, int]:
        return self._shape.dims

    def __len__(self) -> int:
        return len(self._shape)


class ValueMesh(Generic[T]):
    """One value per actor of a mesh: index by rank (``vm[2]``) or coordinates (``vm[{"procs": 2}]``).

    Iterating yields values in rank order; ``items()`` yields ``(coords, value)``.
    """

    def __init__(self, shape: Shape, values: list[T]):
        if len(values) != len(shape):
            raise ValueError("one value per point is required")
        self._shape = shape
        self._values = values

    @property
    def shape(self) -> dict[str, int]:
        return self._shape.dims

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, key: int | dict[str, int] | tuple[int, ...]) -> T:
        if isinstance(key, int):
            return self._values[key]
        return self._values[self._shape.rank_of(key)]

    def __iter__(self) -> Iterator[T]:
        return iter(self._values)

    def values(self) -> list[T]:
        return list(self._values)

    def items(self) -> Iterator[tuple[dict[str, int], T]]:
        for rank, v in enumerate(self._values):
            yield self._shape.coords(rank), v

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, ValueMesh):
            return self._values == other._values and self.shape == other.shape
        return NotImplemented

    def __repr__(self) -> str:
        return f"ValueMesh({self.shape}, {self._values!r})"

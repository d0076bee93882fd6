"""Tile layouts: how a tensor is cut into blocks, one block per tile.

A tensor is first viewed in a row-major reshape (`view`), each view dimension is split into
`grid` parts of `block` elements (the last part padded), and block i of the flattened grid lives
on tile `start + i`. `to_tiles` states this in code: the tensor as `[tiles, *block]`, each
tile's block in turn; `from_tiles` is its inverse. The cost model reads layouts (what each tile
holds, what an exchange moves, when a move is free); the runtime keeps tensors in logical
order, since where an element sits never changes its value (see `tile_rules`).

Linear mapping, Poplar's default for tensors no op lays out, is the one-dimensional case: the
flattened tensor cut into equal runs of whole grains, at least `min_bytes_per_tile` per tile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

Array = Any


@dataclass(frozen=True, slots=True)
class Layout:
    """A tensor of `shape`, viewed as `view`, split into `grid` blocks on tiles from `start`."""

    shape: tuple[int, ...]
    view: tuple[int, ...]
    grid: tuple[int, ...]
    start: int = 0
    # Block sizes when they are larger than the even split (linear mapping rounds each tile's
    # run up to whole grains); empty for the even split `ceil(view / grid)`.
    chunk: tuple[int, ...] = ()
    # The block sizes, found once: passes read them several times per layout they make.
    block: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Checked on every layout the scheduler makes (hundreds of thousands for GPT-3), so
        # the common cases are cheap: a view that is the shape, no uneven blocks.
        if self.view is not self.shape and math.prod(self.shape) != math.prod(self.view):
            raise ValueError(f"view {self.view} does not hold shape {self.shape}")
        if len(self.grid) != len(self.view) or (self.grid and min(self.grid) < 1):
            raise ValueError(f"grid {self.grid} does not fit view {self.view}")
        even = tuple(-(-v // g) if v else 0 for v, g in zip(self.view, self.grid, strict=True))
        if self.chunk and any(c < e for c, e in zip(self.chunk, even, strict=True)):
            raise ValueError(f"blocks {self.chunk} cannot hold view {self.view} in {self.grid}")
        object.__setattr__(self, "block", self.chunk or even)

    def storage(self) -> tuple[int, int, int]:
        """(start, tiles, run): the layout as contiguous runs of the row-major tensor, one per
        tile, when it splits only its first view dimension longer than one; (-1, 0, 0)
        otherwise. Two layouts with equal storage hold every element on the same tile, so
        moving between them is free."""
        grid = [g for v, g in zip(self.view, self.grid, strict=True) if v != 1]
        if any(g != 1 for g in grid[1:]):
            return (-1, 0, 0)
        return (self.start, self.tiles, math.prod(self.block))

    def same_place(self, other: Layout) -> bool:
        """Whether every element of the tensor sits on the same tile in both layouts."""
        if (self.view, self.grid, self.start, self.block) == (
            other.view,
            other.grid,
            other.start,
            other.block,
        ):
            return True
        mine = self.storage()
        return mine[0] >= 0 and mine == other.storage()

    @property
    def tiles(self) -> int:
        return math.prod(self.grid)

    @property
    def block_elements(self) -> int:
        return math.prod(self.block)

    @property
    def stop(self) -> int:
        return self.start + self.tiles

    def tile_range(self) -> range:
        return range(self.start, self.stop)


def linear_layout(
    shape: tuple[int, ...],
    itemsize: int,
    tiles: int,
    *,
    grain_bytes: int,
    min_bytes: int,
    start: int = 0,
) -> Layout:
    """Poplar's linear mapping: whole grains, at least `min_bytes` per tile, over few enough
    tiles that every tile used gets an equal run (the last one the remainder)."""
    elements = math.prod(shape)
    start = start if start < tiles else 0
    if elements == 0:
        return Layout(shape, (0,), (1,), start)
    grain = max(1, grain_bytes // itemsize)
    per_tile_min = max(grain, -(-min_bytes // itemsize))
    used = max(1, min(tiles, elements // per_tile_min))
    share = -(-elements // used)
    per_tile = -(-share // grain) * grain  # an equal share, in whole grains
    used = -(-elements // per_tile)
    start = start if start + used <= tiles else 0
    return Layout(shape, (elements,), (used,), start, (per_tile,))


def to_tiles(x: Array, layout: Layout, pad_value: Any = 0) -> Array:
    """The logical array as `[tiles, *block]`, padding the last block of each view dim."""
    block = layout.block
    x = jnp.reshape(x, layout.view)
    padding = [(0, g * b - v, 0) for v, g, b in zip(layout.view, layout.grid, block, strict=True)]
    if any(high for _, high, _ in padding):
        x = lax.pad(x, jnp.asarray(pad_value, x.dtype), padding)
    split = [d for g, b in zip(layout.grid, block, strict=True) for d in (g, b)]
    x = jnp.reshape(x, split)
    rank = len(layout.view)
    x = jnp.transpose(x, [2 * i for i in range(rank)] + [2 * i + 1 for i in range(rank)])
    return jnp.reshape(x, (layout.tiles, *block))


def from_tiles(tiles: Array, layout: Layout) -> Array:
    """The logical array from its `[tiles, *block]` form, padding dropped."""
    block = layout.block
    rank = len(layout.view)
    x = jnp.reshape(tiles, (*layout.grid, *block))
    x = jnp.transpose(x, [d for i in range(rank) for d in (i, rank + i)])
    x = jnp.reshape(x, [g * b for g, b in zip(layout.grid, block, strict=True)])
    x = x[tuple(slice(0, v) for v in layout.view)]
    return jnp.reshape(x, layout.shape)


def free_move(source: Layout, target: Layout) -> bool:
    """Whether a re-layout moves no data: same tiles, same runs, and no padding to fill."""
    unpadded = math.prod(target.view) == target.tiles * target.block_elements
    return unpadded and source.same_place(target)


def tile_bytes(layout: Layout, dtype: np.dtype) -> int:
    """Bytes one tile holds of a tensor in this layout (a full block)."""
    return layout.block_elements * np.dtype(dtype).itemsize

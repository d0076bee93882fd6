"""Tile layouts: how a tensor is cut into blocks, one block per tile.

A tensor is first viewed in a row-major reshape (`view`), each view dimension is split into
`grid` parts of `block` elements (the last part padded), and block i of the flattened grid lives
on tile `start + i`. The simulator stores such a tensor as one array with a leading tile axis,
`[tiles, *block]`; `to_tiles` and `from_tiles` convert between that and the logical array, so a
change of layout (an exchange) is a static reshape/pad/transpose that XLA fuses into one copy.

Linear mapping, Poplar's default for tensors no op lays out, is the one-dimensional case: the
flattened tensor cut into equal runs of whole grains, at least `min_bytes_per_tile` per tile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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

    def __post_init__(self) -> None:
        if math.prod(self.shape) != math.prod(self.view):
            raise ValueError(f"view {self.view} does not hold shape {self.shape}")
        if len(self.grid) != len(self.view) or any(g < 1 for g in self.grid):
            raise ValueError(f"grid {self.grid} does not fit view {self.view}")

    @property
    def block(self) -> tuple[int, ...]:
        return tuple(-(-v // g) if v else 0 for v, g in zip(self.view, self.grid, strict=True))

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
    grain = max(1, grain_bytes // itemsize)
    per_tile_min = max(grain, -(-min_bytes // itemsize))
    used = max(1, min(tiles, elements // per_tile_min if elements else 1))
    per_tile = -(-elements // used) if elements else 1
    per_tile = -(-per_tile // grain) * grain  # whole grains
    used = max(1, -(-elements // per_tile)) if elements else 1
    start = start if start + used <= tiles else 0
    return Layout(shape, (elements,), (used,), start)


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
    order = [d for i in range(rank) for d in (i, rank + i)]
    x = jnp.transpose(x, order)
    x = jnp.reshape(x, [g * b for g, b in zip(layout.grid, block, strict=True)])
    x = x[tuple(slice(0, v) for v in layout.view)]
    return jnp.reshape(x, layout.shape)


def relayout(tiles: Array, source: Layout, target: Layout, pad_value: Any = 0) -> Array:
    """An exchange: the same tensor moved from one layout to another (static, no data test)."""
    if source == target:
        return tiles
    return to_tiles(from_tiles(tiles, source), target, pad_value)


def tile_bytes(layout: Layout, dtype: np.dtype) -> int:
    """Bytes one tile holds of a tensor in this layout (a full block)."""
    return layout.block_elements * np.dtype(dtype).itemsize

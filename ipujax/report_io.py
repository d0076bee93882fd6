"""The cost report's view of a step's IO: the IO tiles' streaming buffers as tiles of their own
(among the fullest tiles when they are, so that every table names the tile the summary's peak
is on), and what the step's IO figures assume, as caveats.
"""

from __future__ import annotations

import numpy as np

from lowering import shorten_paths
from partitioner import MEMORY_CATEGORIES, Built, TileUsage


def io_tile_memory(built: Built) -> np.ndarray:
    """Bytes on each IO tile of one IPU: its share of the streaming buffers (none unphased)."""
    buffers = built.cost.io_buffers
    return np.full(buffers.tiles, buffers.bytes_per_tile, np.int64)


def _io_usage(built: Built, tile: int, nbytes: int) -> TileUsage:
    buffers = built.cost.io_buffers
    what = (
        f"streaming buffers: two pieces in flight of {buffers.piece_bytes:,} B (the largest "
        f"tensor streamed, {buffers.largest_bytes:,} B, in {buffers.pieces}) over "
        f"{buffers.tiles} IO tiles"
    )
    categories = tuple(
        (name, nbytes if name == "variables_not_always_live" else 0) for name in MEMORY_CATEGORIES
    )
    return TileUsage(0, tile, nbytes, ((nbytes, what),), categories)


def with_io_tiles(built: Built, top: tuple[TileUsage, ...]) -> tuple[TileUsage, ...]:
    """The fullest tiles `top` of the compute tiles, with the IO tiles (numbered after them)
    among them where they are fuller: the same number of tiles, fullest first."""
    io = io_tile_memory(built)
    first = int(built.memory.total.size)
    extra = [_io_usage(built, first + i, int(b)) for i, b in enumerate(io[: len(top) or 1])]
    merged = sorted((*top, *extra), key=lambda usage: -usage.bytes)  # stable: compute first
    return tuple(merged[: max(len(top), 1 if extra else 0)])


def io_caveats(built: Built) -> tuple[str, ...]:
    """What the step's IO figures assume: host transfers hidden behind compute (and what was
    charged), a tensor streamed through the IO tiles in pieces."""
    return tuple(shorten_paths(line) for line in built.cost.notes)

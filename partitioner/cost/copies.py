"""Data moved on a tile: copies, transposes, slices and fills, as PopLibs charges them
(docs/target.md, "On-tile copies").

Where a layout changes on a tile, a tile copies or transposes its block:

- a copy of B bytes whose contiguous runs are whole atoms of 8, 4 or 2 bytes costs
  587 + 0.4404, 3.125 or 5.148 cycles per byte, PopLibs' regression over 10,000 measured
  rearrangements (`experimentalConvTransformsEstimates` in `lib/poplin/ConvModel.cpp`): runs of
  whole 8-byte words move at a word a cycle or so, runs of single halves an element at a time;
- a transpose (what grouping a matmul's operand by 16 channels needs) runs PopLibs' transpose
  vertices, a 4 x 4 block of halves in 4 thread cycles or a 2 x 2 block of floats in 3
  (`Transpose1D` and `Transpose2D`, whose estimators PopLibs shipped until 2022);
- slices at offsets (gather, dynamic slices) run `MultiSlice`: per offset 19 cycles plus 2 per
  vector of 4 bytes (halves) or 8 bytes (floats), per worker (`getMultiSliceCycleEstimate`);
- new elements (pads, iotas) are filled: 26 + one cycle per natural vector (`Fill`).

Workers run in a barrel, so a tile's cycles are six times its busiest worker's.
"""

from __future__ import annotations

import math

import numpy as np

from partitioner.target import Target

# PopLibs' regression of rearrangement copies: cycles per tile = 587 + rate x bytes, by the
# largest atom (8, 4 or 2 bytes) the contiguous runs are made of. Single bytes: the 2-byte rate
# per element, twice the rate per byte (A).
_COPY_FIXED = 587
_COPY_RATE = {8: 0.4404, 4: 3.125, 2: 5.1484, 1: 2 * 5.1484}


def atom_bytes(run_bytes: int) -> int:
    """The largest atom (8, 4, 2 or 1 bytes) a contiguous run is a whole number of."""
    return next(a for a in (8, 4, 2, 1) if run_bytes % a == 0)


def copy_cycles(nbytes: int, run_bytes: int) -> int:
    """A tile copying `nbytes` in contiguous runs of `run_bytes` (PopLibs' regression)."""
    if nbytes <= 0:
        return 0
    return _COPY_FIXED + math.ceil(_COPY_RATE[atom_bytes(run_bytes)] * nbytes)


def _transpose2d(matrices: int, rows: int, cols: int) -> int:
    """`Transpose2D` on 4-byte elements (thread cycles): the fast path for even sizes within
    its strides, element by element otherwise."""
    fast = rows % 2 == 0 and cols % 2 == 0 and cols // 2 < 4096
    if fast and rows * (cols - 2) // 2 < 512 and rows < 512:
        return 27 + matrices * (11 + (rows // 2) * (6 + 3 * (cols // 2 - 1)))
    return 13 + matrices * (8 + cols * (5 + rows * 2))


def _transpose_worker_half(matrices: int, rows4: int, cols4: int, split: bool) -> int:
    """`Transpose1D`'s worker on halves in 4 x 4 blocks (`TransposeWorkerCycles`); `split`: one
    matrix's rows shared by the workers (`SplitTranspose1D`)."""
    if rows4 == 1 and cols4 == 1:
        return 17 + (12 if matrices == 1 else 20 + (matrices - 2) * 4)
    if cols4 == 1:
        core = 20 + 4 * (rows4 - 2)
        return 25 + core if split else 27 + matrices * (15 + core)
    if split:
        return 27 + rows4 * (12 + 4 * (cols4 - 2))
    return 29 + matrices * (18 + rows4 * (12 + 4 * (cols4 - 2)))


def _transpose_slow_half(matrices: int, rows: int, cols: int) -> int:
    """`Transpose2D` on halves that are not whole 4 x 4 blocks (thread cycles)."""
    return 15 + matrices * (8 + cols * (5 + rows * 5 // 2))


def transpose_cycles(matrices: int, rows: int, cols: int, itemsize: int, target: Target) -> int:
    """A tile transposing `matrices` matrices of [rows, cols]. Halves in whole 4 x 4 blocks run
    the `Transpose1D` MultiVertex (7 supervisor cycles and 6 workers, each taking whole
    matrices, or a share of one matrix's rows when there are fewer matrices than workers);
    floats, and halves that are not whole blocks, run `Transpose2D` on whole matrices, one
    vertex per worker. Eight-byte elements are transposed as pairs of floats, single bytes as
    halves (A)."""
    if matrices <= 0 or rows <= 0 or cols <= 0:
        return 0
    workers = target.threads_per_tile
    per_worker = math.ceil(matrices / workers)
    if itemsize >= 4:
        return workers * _transpose2d(per_worker, rows, cols * (itemsize // 4))
    if rows % 4 or cols % 4:
        return workers * _transpose_slow_half(per_worker, rows, cols)
    if matrices >= workers:
        worker = _transpose_worker_half(per_worker, rows // 4, cols // 4, split=False)
    else:
        share = math.ceil(rows // 4 / (workers // matrices))
        worker = _transpose_worker_half(1, share, cols // 4, split=True)
    return 7 + workers * (worker - 7)


def slice_cycles(offsets: int, slice_bytes: int, itemsize: int, target: Target) -> int:
    """A tile copying `offsets` slices of `slice_bytes` each from given offsets (`MultiSlice`):
    30 cycles per worker, then per offset 19 plus 2 (3 for bytes) per vector; one slice is
    spread over all workers."""
    if offsets <= 0 or slice_bytes <= 0:
        return 0
    workers = target.threads_per_tile
    width, per_vector = {1: (4, 3), 2: (4, 2)}.get(itemsize, (target.vector_bytes_per_cycle, 2))
    vectors = math.ceil(slice_bytes / width)
    if offsets == 1:
        vectors = math.ceil(vectors / workers)
    per_worker = math.ceil(offsets / workers)
    return workers * (30 + per_worker * (19 + vectors * per_vector))


def fill_cycles(elements: int, dtype: np.dtype, target: Target) -> int:
    """A tile writing `elements` new elements, one `Fill` per worker (`_fillCycleEstimate`):
    halves 26 cycles then one per natural vector; 4-byte elements 16 + 6 + 1 around one per
    vector; single bytes 39 + one per 8 bytes; 8-byte elements 5 + one each."""
    if elements <= 0:
        return 0
    workers = target.threads_per_tile
    n = math.ceil(elements / workers)
    size = np.dtype(dtype).itemsize
    width = max(1, target.vector_bytes_per_cycle // size)
    if size == 1:
        per_worker = 28 + n // 4 if n < 64 else 39 + n // 8
    elif size == 2:
        per_worker = {1: 15, 2: 21}.get(n, 26 + n // width)
    elif size == 4:
        per_worker = 16 + n // width + 6 + (n % width == 1) + 1
    else:
        per_worker = 5 + n
    return workers * per_worker

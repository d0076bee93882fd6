"""Linear algebra and FFTs on a tile: the leaf formulas the `linalg` tile rule adds up.

PopLibs factors a matrix as poplin's `cholesky` does (`lib/poplin/Cholesky.cpp`): in blocks of
`LINALG_BLOCK` (its `blockSize` option, 8 by default), each diagonal block factored by one
vertex on one worker (`poplin::Cholesky`), its inverse by `TriangularInverseWithTranspose`
vertices of up to six columns each, and the rest by matmuls on the AMP
(`matMulGroupedAcc`), which `tiles.matmul_plan` plans and costs. A triangular solve's diagonal
blocks run poplin's `TriangularSolve` vertex, one right-hand side each
(`lib/poplin/codelets/TriangularSolve.cpp`). PopLibs publishes no cycle estimate for these
vertices; they are charged here as a worker's share of the 64-bit vector path (A:
docs/target.md, "Linear algebra, FFT and callbacks"):

- a vertex on one worker retires one multiply-add per lane per thread cycle (2 f32 lanes, 4 f16),
  two FLOPs; six workers share a tile in a barrel, so a tile's cycles are six times its
  busiest worker's;
- an FFT's butterflies (PopLibs has none) run on all six workers at one FLOP per lane per thread
  cycle (a complex butterfly is adds and multiplies, not fused).
"""

from __future__ import annotations

import math

import numpy as np

from partitioner.target import Target

# poplin's `CholeskyOptions` default block size (`blockSize(8)`).
LINALG_BLOCK = 8


def real_dtype(dtype: np.dtype) -> np.dtype:
    """The type a complex value's components have; a real type itself."""
    dtype = np.dtype(dtype)
    return np.finfo(dtype).dtype if np.issubdtype(dtype, np.complexfloating) else dtype


def lanes(dtype: np.dtype, target: Target) -> int:
    """Elements of the (real) type per 64-bit vector: 2 f32, 4 f16."""
    return max(1, target.vector_bytes_per_cycle // real_dtype(dtype).itemsize)


def serial_vertex_cycles(flops: int, vertices: int, dtype: np.dtype, target: Target) -> int:
    """Tile cycles of `vertices` vertices of `flops` FLOPs each on one tile, each on one worker
    at one multiply-add per lane per thread cycle (A), the workers taking them in turns."""
    if flops <= 0 or vertices <= 0:
        return 0
    thread = math.ceil(flops / (2 * lanes(dtype, target)))
    rounds = math.ceil(vertices / target.threads_per_tile)
    return target.threads_per_tile * rounds * thread


def vector_flop_cycles(flops: int, dtype: np.dtype, target: Target) -> int:
    """Tile cycles of `flops` FLOPs spread over a tile's workers at one FLOP per lane per thread
    cycle (A): the FFT's butterflies."""
    if flops <= 0:
        return 0
    per_worker = math.ceil(flops / target.threads_per_tile)
    return target.threads_per_tile * math.ceil(per_worker / lanes(dtype, target))


def fft_tiles_per_transform(transforms: int, points: int, itemsize: int, target: Target) -> int:
    """Tiles one transform is spread over (A): when there are fewer transforms than tiles, each
    takes its share of the tiles, at least `min_bytes_per_tile` of its points on each."""
    if transforms >= target.tiles_per_ipu:
        return 1
    by_tiles = target.tiles_per_ipu // transforms
    by_bytes = max(1, (points * itemsize) // target.min_bytes_per_tile)
    return max(1, min(by_tiles, by_bytes))

"""A reduction where its operand lies (docs/target.md, "Vector work"): each tile reduces the block
it holds and only the partials move, as `popops::reduce` makes its first stage's partials on
the tiles that hold the input. Derived by hand from PopLibs' `StridedReduce` estimate
(lib/popops/reduction/CycleEstimationFunctions.cpp): 16 cycles, then per 64 bits of a
worker's outputs 3 + 5 (floats) + 3 + partials - 1, six workers in a barrel."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_trees_close, compile_for


def column_sums(a, b):
    return jnp.sum(a @ b, axis=0)


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")  # a small step, its input sent
def test_a_sum_over_a_matmuls_rows_reduces_on_the_matmuls_tiles() -> None:
    """[256, 64] @ [64, 128] in f32 on 16 tiles: the matmul leaves its result in a 4 x 4 grid of
    [64, 32] blocks. Summed over the 256 rows, each tile reduces its own block, 32 outputs of
    64 partials with the outputs innermost (strided): 6 outputs a worker, 3 vectors of 2
    floats, 16 + 3 x (3 + 5 + 3 + 64 - 1) = 238 cycles a worker, 1,428 a tile, with nothing
    exchanged. Then 4 tiles each receive the 4 partials of their 32 outputs, 4 x 32 x 4 =
    512 B, and add them: 16 + 3 x (3 + 5 + 3 + 4 - 1) = 58 a worker, 348 a tile."""
    a = np.random.default_rng(0).normal(size=(256, 64)).astype(np.float32)
    b = np.random.default_rng(1).normal(size=(64, 128)).astype(np.float32)
    compiled = compile_for(column_sums, a, b)
    (matmul,) = [t for t in compiled.program.tasks if t.op.name == "dot_general"]
    assert matmul.result_layouts[0].grid == (1, 4, 4)
    (reduce,) = [t for t in compiled.program.tasks if t.op.name == "reduce"]
    local, combine = reduce.supersteps
    assert (local.tiles, local.compute_cycles, local.busiest_tile_bytes) == (16, 1428, 0)
    assert (combine.tiles, combine.compute_cycles, combine.busiest_tile_bytes) == (4, 348, 512)
    assert_trees_close(compiled(a, b), jax.jit(column_sums)(a, b), rtol=1e-5, atol=1e-4)


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")
def test_reductions_spread_their_outputs_over_the_chip() -> None:
    """Two small reductions do not both land their outputs on tile 0."""

    def two(x, y):
        return jnp.sum(x, axis=1), jnp.sum(y, axis=1)

    x = np.ones((8, 4096), np.float32)
    compiled = compile_for(two, x, x)
    starts = [t.result_layouts[0].start for t in compiled.program.tasks if t.op.name == "reduce"]
    assert len(set(starts)) == 2

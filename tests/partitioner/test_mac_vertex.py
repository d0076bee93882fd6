"""The horizontal MAC vertex worked out by hand, and the planner choosing it over the AMP.

Every expected number is derived in a comment from PopLibs' estimators in
`lib/poplin/PerformanceEstimation.hpp` (graphcore/poplibs at 7eac0f26), never by calling the
code under test: `getDenseDotProductCycles` (DOT), `getConvPartialHorizontalMacCycleEstimate`
(WORKER), `estimateConvPartialHorizontalMacInnerLoopCycles` with
`getConvPartialHorizontalMacSupervisorInnerLoopCycleEstimate` (INNER: the busiest worker's
cycles plus 16, times 6), `getConvPartialHorizontalMacSupervisorOuterLoopCycleEstimate` (OUTER)
and `estimateZeroSupervisorCycles` (ZERO), combined as `ConvModel.cpp`'s `Plan::Hmac` case.
Bow constants: 6 workers, a 64-bit data path (2 floats or 4 halves a load), 1,472 tiles at
1.85 GHz.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from helpers import assert_trees_close, device_steps, mesh, spec

import ipujax
from partitioner.cost.amp import amp_cycles
from partitioner.cost.mac import dot_cycles, mac_cycles
from partitioner.tiles.matmul_plan import plan_matmul

BOW = ipujax.Target.bow()
F32, F16 = np.dtype(np.float32), np.dtype(np.float16)


def _matvec(a: jax.Array, x: jax.Array) -> jax.Array:
    return a @ x


def test_dot_product_cycles() -> None:
    # DOT: 7 cycles around the loop (repeat 1 + wind-down 2, add into the partial 3, branch
    # 1), then per vector of the widest width dividing the size 1 cycle at a full 64-bit
    # vector, else 2 plus 1 to warm up; halves 1 fewer.
    assert dot_cycles(4096, False, BOW) == 7 + 4096 // 2  # 2,055
    assert dot_cycles(1024, False, BOW) == 7 + 512
    assert dot_cycles(5, False, BOW) == 7 + 1 + 5 * 2  # odd: one float a load
    assert dot_cycles(1024, True, BOW) == 7 + 256 - 1
    assert dot_cycles(6, True, BOW) == 7 + 1 + 3 * 2 - 1  # pairs of halves


def test_mac_vertex_on_a_float_matvec_block() -> None:
    # [45, 1024] x [1024, 1] f32 on one tile (the matvec's block below).
    # INNER: one field row of 45 outputs (a matmul's rows are flattened): split into 6
    # pieces, the busiest worker takes ceil(45 / 6) = 8 outputs.
    # WORKER (f32, not the 1x1 vertex: it is for halves): 16 - 0 retained, per run 19, per
    # output 7 + DOT(1024) = 7 + 519 = 526: 16 + 19 + 8 x 526 = 4,243; plus 16 outside the
    # loops = 4,259; x 6 workers = 25,554.
    # OUTER: 58 (float overhead) + 6 x 9 (partials' zeroing state) + 6 x 0 + 1 conv group x
    # (23 + 1 input group x (15 + 1 output channel x (10 + 25,554))) = 58 + 54 + 25,602 =
    # 25,714.
    # ZERO: 45 partials, 8 a worker, 4 vectors of 2 floats: (4 + 14 - 9) x 6 = 54.
    # 25,714 + 54 = 25,768.
    assert mac_cycles(45, 1024, 1, 1, F32, BOW) == 25_768
    # The AMP pads the one column to 16 output channels and loads 64 coefficient cycles per
    # 8 input channels: more than twice as long on the same block.
    assert amp_cycles(45, 1024, 1, 1, F32, BOW) > 2 * 25_768


def test_resident_f32_matvec_streams_its_matrix_through_the_mac_vertex() -> None:
    # A resident f32 [16384, 4096] x [4096] on one Bow IPU. The plan: rows over 368 tiles
    # (256, stretched to 1,472 / 4), K over 4: a tile's block is ceil(16384 / 368) = 45 rows
    # x 1,024 = 184,320 B of the matrix, on the MAC vertex (25,768 cycles, above).
    plan = plan_matmul(1, 16384, 1, 4096, F32, 4, BOW)
    assert (plan.b, plan.m, plan.n, plan.k, plan.serial) == (1, 368, 1, 4, 1)
    assert (plan.vertex, plan.swap) == ("mac", False)
    a, x = spec((16384, 4096)), spec((4096,))
    bow = ipujax.make_mesh((1,), ("ipu",), target=BOW)
    matvec = ipujax.jit(_matvec, mesh=bow, resident_argnames=("a",))
    matmul, reduce = device_steps(matvec.lower(a, x).compile().cost_report())
    # The matrix is created in the matmul's layout, so only the vector moves: each tile
    # holds 1/368 of its 1,024-float block and receives the rest, 4,096 - 11 = 4,085 B ->
    # ceil(4,085 / 4) + 100 = 1,122 cycles.
    assert (matmul.tiles, matmul.exchange_cycles, matmul.compute_cycles) == (1472, 1122, 25_768)
    # The 4 K tiles' partials of each 45-output block reduced on 368 tiles: 4 x 45 x 4 B =
    # 720 B -> 180 + 100 = 280 cycles; the general ReduceAdd vertex (45 outputs are not whole
    # vectors of 4): 11 + 1 loops, 2 a worker, (32 + (3 x 4 + 7) x 2) x 6 = 420.
    assert (reduce.tiles, reduce.exchange_cycles, reduce.compute_cycles) == (368, 280, 420)
    # The rate: 268,435,456 B x 1.85 GHz / 25,768 = 19.27 TB/s in the matmul's compute set,
    # against 1,472 x 8 B x 1.85 GHz = 21.79 TB/s of 64-bit loads (the busiest worker's 8 of
    # 7.5 average outputs and the 14 cycles around each 512-cycle dot product account for
    # the rest); over the whole op, 27,770 cycles with syncs: 17.88 TB/s.
    matrix = 16384 * 4096 * 4
    rate = matrix * BOW.clock_hz / matmul.compute_cycles / 1e12
    assert round(rate, 2) == 19.27
    whole = sum(s.cycles for s in (matmul, reduce))
    assert whole == 1122 + 90 + 25_768 + 280 + 90 + 420 == 27_770
    assert round(matrix * BOW.clock_hz / whole / 1e12, 2) == 17.88


def test_a_large_f16_matmul_stays_on_the_amp() -> None:
    # The MAC vertex computes one output channel at a time, 4 halves a cycle: on the
    # tessellate block [2048, 16] x [16, 16] the 1x1 vertex's busiest worker takes 342
    # outputs, each 2 + DOT(16) = 2 + (7 + 4 - 1) = 12: 16 - 15 + 14 + 342 x 12 + 16 = 4,135;
    # x 6 = 24,810; OUTER 65 - 10 + 6 x (9 + 15) + 23 + 15 + 16 x (10 + 24,810) = 397,357
    # and no zeroing (one input group): 47 times the AMP's 8,521.
    assert mac_cycles(2048, 16, 16, 1, F16, BOW) == 397_357
    assert amp_cycles(2048, 16, 16, 1, F16, BOW) == 8521
    plan = plan_matmul(1, 4096, 4096, 4096, F16, 4, BOW, F16)
    assert plan.vertex == "amp"
    assert plan_matmul(1, 16384, 1, 4096, F16, 4, BOW, F16).vertex == "mac"


def test_mac_planned_matvec_values_are_jax_jit() -> None:
    # Only the cost changes: the kernels compute jax's contraction with f32 partials.
    a = jax.random.normal(jax.random.key(0), (256, 512), jnp.float32)
    x = jax.random.normal(jax.random.key(1), (512,), jnp.float32)
    assert plan_matmul(1, 256, 1, 512, F32, 4, BOW.with_tiles(16)).vertex == "mac"
    compiled = ipujax.jit(_matvec, mesh=mesh(16), resident_argnames=("a",))
    assert_trees_close(compiled(a, x), jax.jit(_matvec)(a, x), rtol=1e-5, atol=1e-4)

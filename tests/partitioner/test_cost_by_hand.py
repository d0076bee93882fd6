"""Cost figures derived by hand from PopLibs' estimator text and the Target's constants.

Every expected number is worked out in a comment from the PopLibs formula the cost model copies
(its file and function are named) and the Bow constants: 6 worker contexts; a 64-bit data path,
so a natural vector of 2 floats or 4 halves; 16 conv units fed 16 half or 8 float input channels
and 16 output channels a pass; coefficients loaded at 8 B a cycle (PopLibs' default 64-bit
loads). None is computed by calling the code path under test.

PopLibs sources (graphcore/poplibs at 7eac0f26 unless noted):
  B1D  lib/popops/popopsCycleEstimators.cpp  BinaryOp1D, UnaryOp1D, Select, Clamp and
       `binaryOpInnerLoopCycles`, `unaryOpInnerLoopCycles`; rates in popopsCycleEstimators.hpp
  PE   lib/popops/PerformanceEstimation.cpp  `basicOpSupervisorOverhead`, `basicOpLoopCycles`,
       `castWorkerCycles`, `getCast1DCycleEstimate`, `getMultiSliceCycleEstimate`,
       `_fillCycleEstimate`
  RED  lib/popops/reduction/CycleEstimationFunctions.cpp  ReduceAllRegionsContinuous and
       StridedReduce
  AMP  lib/poplin/PerformanceEstimation.hpp  `getConvPartial1x1Supervisor*` (the matmul vertex)
       and `getReduceCycleEstimate`
  REG  lib/poplin/ConvModel.cpp  the rearrangement regression (587 + rate x bytes)
  T2D  lib/popops/popopsCycleEstimators.cpp at a025a6c5 (Transpose2D, Transpose1D)

Whole programs are derived with the formulas the code documents, and say where a PopLibs
figure would differ.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from helpers import BOW_BYTES_PER_TILE, compile_for, device_cycles, device_steps, spec, target

import ipujax
from partitioner.cost.amp import (
    amp_cycles,
    inner_loop_cycles,
    partials_reduce_cycles,
    reduce_plan,
)
from partitioner.cost.copies import (
    atom_bytes,
    copy_cycles,
    fill_cycles,
    slice_cycles,
    transpose_cycles,
)
from partitioner.cost.exchange import exchange_cycles
from partitioner.cost.vector import (
    binary_cycles,
    cast_cycles,
    clamp_cycles,
    compare_cycles,
    elementwise_cycles,
    prologue_cycles,
    reduce_cycles,
    select_cycles,
    unary_cycles,
    vector_width,
)
from partitioner.tiles.matmul_plan import plan_matmul, problem, tile_cycles

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
BF16 = np.dtype(ml_dtypes.bfloat16)
I32 = np.dtype(np.int32)
BOW = ipujax.Target.bow()

# ---- presets -------------------------------------------------------------------------------


def test_bow_preset_numbers() -> None:
    t = ipujax.Target.bow()
    assert t.name == "bow"
    assert t.tiles_per_ipu == 1472  # V
    assert t.bytes_per_tile == 638_976  # D: 624 KiB = 624 * 1024
    assert t.bytes_per_tile == 624 * 1024
    assert t.clock_hz == 1.85e9  # C
    assert t.threads_per_tile == 6
    assert t.amp_flops_per_cycle_half == 128  # 16 AMP units x 4 x 2
    assert t.amp_flops_per_cycle_float == 32
    # The AMP as ConvPartial1x1Out drives it: 16 conv units, 16 half or 8 float input
    # channels and 16 output channels a group; 16 B/cycle coefficient loads halved by
    # PopLibs' default `use128BitConvUnitLoad = false` (ConvOptions.hpp:42) to 8.
    assert (t.conv_units, t.amp_in_chans_half, t.amp_in_chans_float) == (16, 16, 8)
    assert (t.amp_out_chans, t.coeff_load_bytes_per_cycle) == (16, 8)


def test_mk2_preset_numbers() -> None:
    t = ipujax.Target.mk2()
    assert (t.tiles_per_ipu, t.bytes_per_tile, t.clock_hz) == (1472, 638_976, 1.325e9)
    assert (t.amp_flops_per_cycle_half, t.amp_flops_per_cycle_float) == (128, 32)


def test_mk1_preset_numbers() -> None:
    t = ipujax.Target.mk1()
    assert (t.tiles_per_ipu, t.bytes_per_tile) == (1216, 262_144)  # 256 KiB
    assert t.clock_hz == 1.6e9
    assert (t.amp_flops_per_cycle_half, t.amp_flops_per_cycle_float) == (64, 16)
    assert t.conv_units == 8


@pytest.mark.parametrize(
    ("preset", "half_tflops", "float_tflops"),
    [
        # docs/target.md, "Peak rates the presets imply": 124.5/31.1, 250/62.5, 350/87.5.
        ("mk1", 124.5, 31.1),
        ("mk2", 250.0, 62.5),
        ("bow", 350.0, 87.5),
    ],
)
def test_presets_reproduce_datasheet_peaks(
    preset: str, half_tflops: float, float_tflops: float
) -> None:
    # peak = tiles x FLOP/cycle/tile x clock; e.g. Bow fp16 1472 x 128 x 1.85e9 = 348.6 TFLOPS,
    # sold as 350. Within 1% of the datasheet figure.
    t = getattr(ipujax.Target, preset)()
    half = t.tiles_per_ipu * t.amp_flops_per_cycle_half * t.clock_hz / 1e12
    single = t.tiles_per_ipu * t.amp_flops_per_cycle_float * t.clock_hz / 1e12
    assert half == pytest.approx(half_tflops, rel=0.01)
    assert single == pytest.approx(float_tflops, rel=0.01)


def test_with_tiles_changes_only_the_tile_count() -> None:
    t = ipujax.Target.bow().with_tiles(16)
    assert t.tiles_per_ipu == 16
    assert t.bytes_per_tile == 638_976
    assert t.clock_hz == 1.85e9
    assert t.name == "bow"


@pytest.mark.parametrize(
    "bad", [{"tiles_per_ipu": 0}, {"bytes_per_tile": 0}, {"clock_hz": 0.0}, {"clock_hz": -1.0}]
)
def test_target_rejects_nonsense(bad: dict) -> None:
    fields = {"name": "x", "tiles_per_ipu": 4, "bytes_per_tile": 1024, "clock_hz": 1e9, **bad}
    with pytest.raises(ValueError):
        ipujax.Target(**fields)


def test_matmul_memory_budget() -> None:
    # 0.6 x 638,976 = 383,385.6 -> 383,385; MK1: 0.6 x 262,144 = 157,286.4 -> 157,286.
    assert ipujax.Target.bow().matmul_memory_budget == 383_385
    assert ipujax.Target.mk1().matmul_memory_budget == 157_286


# ---- exchange ------------------------------------------------------------------------------


def test_exchange_cycles() -> None:
    t = ipujax.Target.bow()
    assert exchange_cycles(t, 0) == 0  # nothing moves: no exchange at all
    assert exchange_cycles(t, -8) == 0
    assert exchange_cycles(t, 400) == 100 + 100  # 400 B / 4 B per cycle + 100 overhead
    assert exchange_cycles(t, 1) == 1 + 100  # ceil(1 / 4) = 1
    assert exchange_cycles(t, 5) == 2 + 100  # ceil(5 / 4) = 2
    assert exchange_cycles(t, 1024) == 256 + 100


# ---- vector ops: popops' 1-D vertices --------------------------------------------------------
#
# A MultiVertex's estimate is in tile cycles: 6 x (the busiest worker's thread cycles) plus the
# supervisor's. Each worker takes ceil(n / 6) elements. The inner loop of a rate
# {cycles, natural, unroll} (`OpPerformanceInfo`) is ceil(m / vector) x (cycles + overhead) for a
# natural rate, ceil(m / unroll) x cycles for an unrolled one (B1D `binaryOpInnerLoopCycles`).


def test_vector_width() -> None:
    # 64-bit data path: `target.getVectorWidth(type)` = 8 B / element size.
    assert vector_width(BOW, F32) == 2
    assert vector_width(BOW, F16) == 4
    assert vector_width(BOW, np.dtype(np.int8)) == 8
    assert vector_width(BOW, np.dtype(np.float64)) == 1  # at least one element


def test_binary_f32_add() -> None:
    # BinaryOp1D (B1D): workerCycles = 29 (FLOAT); ADD FLOAT is {1, true} and has an assembly
    # codelet (`hasExternalCodelet`), so a natural vector of 2 floats costs 1 + 2 cycles.
    # 256 elements: m = ceil(256 / 6) = 43, ceil(43 / 2) = 22 loops x 3 = 66;
    # 6 x (29 + 66) + 11 (`basicOpSupervisorOverhead`) = 570 + 11 = 581.
    assert binary_cycles("add", 256, F32, BOW) == 581
    # multiply and subtract share the entry: {1, true}, assembly.
    assert binary_cycles("multiply", 256, F32, BOW) == 581
    assert binary_cycles("subtract", 256, F32, BOW) == 581


def test_binary_f16_add() -> None:
    # workerCycles = 26 for HALF; ADD HALF {1, true}: 4 halves per loop of 1 + 2.
    # 256 elements: m = 43, ceil(43 / 4) = 11 loops x 3 = 33; 6 x (26 + 33) + 11 = 365.
    assert binary_cycles("add", 256, F16, BOW) == 365
    # bf16, which the IPU lacks, is costed as f16.
    assert binary_cycles("add", 256, BF16, BOW) == 365


def test_binary_unrolled_and_integer_rates() -> None:
    # DIVIDE FLOAT {10, false, 2}: 2 elements per loop of exactly 10 cycles, no overhead.
    # 96 elements: m = 16, 8 loops x 10 = 80; 6 x (29 + 80) + 11 = 665.
    assert binary_cycles("divide", 96, F32, BOW) == 665
    # MAXIMUM HALF {4, false, 4}: m = 16, 4 loops x 4 = 16; 6 x (26 + 16) + 11 = 263.
    assert binary_cycles("maximum", 96, F16, BOW) == 263
    # ADD INT {7, false, 1}: 7 cycles an element, prologue 26 (not FLOAT).
    # m = 16: 16 x 7 = 112; 6 x (26 + 112) + 11 = 839.
    assert binary_cycles("add", 96, I32, BOW) == 839


def test_prologue_cycles() -> None:
    # What a float BinaryOp1D costs before its loop: 6 x 29 + 11 = 185.
    assert prologue_cycles(BOW) == 185


def test_unary_exp_is_unrolled() -> None:
    # UnaryOp1D (B1D): workerCycles = 33 for EXPONENT (17 otherwise), then
    # `unaryOpInnerLoopCycles`; supervisor 9 + 11.
    # EXPONENT FLOAT {6, false, 2}: 256 elements, m = 43, ceil(43 / 2) = 22 loops x 6 = 132;
    # 6 x (33 + 132) + 9 + 11 = 990 + 20 = 1010.
    assert unary_cycles("exponential", 256, F32, BOW) == 1010
    # EXPONENT HALF {4, false, 4}: ceil(43 / 4) = 11 loops x 4 = 44; 6 x (33 + 44) + 20 = 482.
    assert unary_cycles("exponential", 256, F16, BOW) == 482
    # TANH FLOAT {12, false, 2}, prologue 17: 22 x 12 = 264; 6 x (17 + 264) + 20 = 1706.
    assert unary_cycles("tanh", 256, F32, BOW) == 1706


def test_unary_one_element_per_loop() -> None:
    # ABSOLUTE FLOAT {1, false} (no unroll): one element per loop, plus the unary overhead 4:
    # `basicOpLoopCycles(m, 1, 1 + 4)` = 5 x m. 96 elements: m = 16 -> 80;
    # 6 x (17 + 80) + 20 = 602.
    assert unary_cycles("abs", 96, F32, BOW) == 602


def test_unary_natural_vector_rounds_as_poplibs() -> None:
    # CEIL FLOAT {2, true}: a natural vector of 2 floats in 2 + 4 cycles; PopLibs
    # (PE `basicOpLoopCycles`) computes 6 x (16 + 2 - 1) / 2 = 102 / 2 = 51 for m = 16, where
    # ceil(16 / 2) x 6 = 48. 96 elements: 6 x (17 + 51) + 20 = 428 (a ceil would give 410).
    assert unary_cycles("ceil", 96, F32, BOW) == 428


def test_compare() -> None:
    # LESS_THAN FLOAT {14, false, 4} on a BinaryOp1D (prologue 29: the operands are floats):
    # 256 elements, m = 43, ceil(43 / 4) = 11 loops x 14 = 154; 6 x (29 + 154) + 11 = 1109.
    assert compare_cycles("LT", 256, F32, BOW) == 1109
    # NOT_EQUAL HALF {11, false, 4}, prologue 26: 11 x 11 = 121; 6 x (26 + 121) + 11 = 893.
    assert compare_cycles("NE", 256, F16, BOW) == 893
    # Through the dispatcher, with a bool result.
    assert elementwise_cycles("compare", 256, F32, np.dtype(bool), BOW, "LT") == 1109


def test_select() -> None:
    # Select (B1D `selectCycles`): a 2-D vertex per worker, 5 + (6 + 5 per element), thread
    # cycles; six workers of ceil(256 / 6) = 43 elements: 6 x (5 + 6 + 43 x 5) = 6 x 226 = 1356.
    assert select_cycles(256, BOW) == 1356
    assert elementwise_cycles("select", 256, F32, F32, BOW) == 1356


def test_clamp() -> None:
    # Clamp (B1D `clampCycles`): 5 + 6 + `basicOpLoopCycles(m, 2, 2)` for floats. 30 elements:
    # m = 5, 2 x (5 + 1) / 2 = 6; 6 x (5 + 6 + 6) = 102. (For an even m PopLibs' rounding gives
    # m + 1 where the code gives m, as for CEIL above.)
    assert clamp_cycles(30, F32, BOW) == 102
    # INT: 7 cycles an element (ld, ld, ld, cmp, movnz, cmp, st): 6 x (11 + 35) = 276.
    assert clamp_cycles(30, I32, BOW) == 276


def test_cast_f32_to_f16() -> None:
    # Cast1D (PE `getCast1DCycleEstimate`): 12 + 6 x (castWorkerCycles(m) + 18).
    # castWorkerCycles, float -> half on the aux pipeline: load width 8 / 4 = 2, store width
    # 8 / 2 = 4, vector min(2 x 2 read ports, 4 x 1) = 4 elements, in max(4 / 2, 4 / 4) = 2
    # cycles; prologue 19; the remainder: per bit of ceilLog2(4) = 2, 1 + 2 if set.
    # 256 elements: m = 43 = 10 vectors + 3: 19 + 2 x 10 + (1 + 2) + (1 + 2) = 45;
    # 12 + 6 x (45 + 18) = 12 + 378 = 390.
    assert cast_cycles(256, F32, F16, BOW) == 390
    # 96 elements: m = 16 = 4 vectors: 19 + 8 + 1 + 1 = 29; 12 + 6 x 47 = 294.
    assert cast_cycles(96, F32, F16, BOW) == 294


def test_cast_f16_to_f32() -> None:
    # half -> float: load width 4, store width 2, vector min(4 x 2, 2 x 1) = 2 elements in
    # max(2 / 2, 2 / 2) = 1 cycle; remainder bits ceilLog2(2) = 1.
    # 256 elements: m = 43 = 21 vectors + 1: 19 + 21 + (1 + 2) = 43; 12 + 6 x (43 + 18) = 378.
    assert cast_cycles(256, F16, F32, BOW) == 378
    # Through the dispatcher; a convert to the same type is free.
    assert elementwise_cycles("convert", 256, F16, F32, BOW) == 378
    assert elementwise_cycles("convert", 256, F32, F32, BOW) == 0


def test_composites_and_views() -> None:
    # acos = asin and a subtract (as XLA expands it). ASIN FLOAT {102, false}: one element per
    # loop of 102 + 4; 96 elements: m = 16 -> 1696; 6 x (17 + 1696) + 20 = 10,298. SUBTRACT
    # FLOAT: ceil(16 / 2) = 8 x 3 = 24; 6 x (29 + 24) + 11 = 329. Sum 10,627.
    assert elementwise_cycles("acos", 96, F32, F32, BOW) == 10_298 + 329
    # A bitcast is a view of its operand: no vertex.
    assert elementwise_cycles("bitcast_convert", 96, F32, I32, BOW) == 0
    assert elementwise_cycles("add", 0, F32, F32, BOW) == 0


# ---- reductions ----------------------------------------------------------------------------


def test_reduce_contiguous() -> None:
    # ReduceAllRegionsContinuous (RED `getCycleEstimateReduceAllRegionsContinuous`), one per
    # worker (thread cycles): cyclesPerOp x outputs x (partials / min(accVW, dataPath))
    # + (2 if partials odd) + 12 x outputs + 10, + 7 call overhead.
    # 12 outputs of 100 f32 partials: 2 outputs per worker; min(4 floats, 2 floats) = 2:
    # 1 x 2 x 50 + 0 + 24 + 10 + 7 = 141; x 6 = 846.
    assert reduce_cycles(12, 100, F32, True, 1, BOW) == 846
    # Half partials: min(8, 4) = 4: 2 x 25 + 24 + 10 + 7 = 91; x 6 = 546.
    assert reduce_cycles(12, 100, F16, True, 1, BOW) == 546
    # A variadic reduce (argmax's two operands) repeats the work (A): 2 x 846.
    assert reduce_cycles(12, 100, F32, True, 2, BOW) == 1692


def test_reduce_strided() -> None:
    # StridedReduce (RED): entry/exit 3 + 2, loop setup 6 + 5 = 16; per outer loop over
    # gcd(min(4, 2), stride) = 2 outputs: 3 + cyclesLoopPost (float partials, ADD: 3, store
    # float: 2) + 1 stride x (3 + 1 x (16 - 1)) = 3 + 5 + 18 = 26.
    # 12 outputs of 16 partials: 2 per worker, one outer loop: 16 + 26 = 42; x 6 = 252.
    assert reduce_cycles(12, 16, F32, False, 1, BOW) == 252


# ---- matmuls on the AMP: ConvPartial1x1Out ---------------------------------------------------


def test_inner_loop_cycles() -> None:
    # AMP `getConvPartial1x1SupervisorInnerLoopCycleEstimateHalfFloat`. 16 rows over 6 workers
    # (`partitionConvPartialByWorker`: floor((i + 1) 16 / 6) - floor(i 16 / 6)) = 2,3,3,2,3,3.
    # Half inputs, 16 conv units (the common path), retention saving 7:
    #   zeroing: n = 2: 40 + 1 - 7 = 34 -> x 6 = 204; n = 3: 37 - 7 = 30 -> 180;
    #            max(204, 180 + 14) = 204
    #   no zeroing: 40 + 2 - 7 = 35 -> 210; 38 - 7 = 31 -> 186; max(210, 200) = 210
    assert inner_loop_cycles(16, True, True, BOW) == 204
    assert inner_loop_cycles(16, False, True, BOW) == 210
    # Float inputs, core 8 cycles a row, zeroCyclesPerGroup 8 (16 units), no retention:
    #   zeroing: n = 2: 46 + (2 + 8 x 2) = 64 -> 384; n = 3: 46 + (2 + 24) = 72 -> 432;
    #            max(432, 384 + 14) = 432
    #   no zeroing: n = 2 and n = 3 both 46 -> 276; the tag cost max(276, 276 + 14) = 290
    assert inner_loop_cycles(16, True, False, BOW) == 432
    assert inner_loop_cycles(16, False, False, BOW) == 290


def test_amp_cycles_half() -> None:
    # [16, 32] x [32, 32] in halves: AMP `getConvPartial1x1SupervisorOuterLoopCycleEstimate
    # HalfFloat` with IG = 32 / 16 = 2 input groups, OG = 32 / 16 = 2 output groups, CG = 1,
    # passes = ceil(16 / 16) = 1, weight loads 16 units x (16 x 2 B) / 8 B = 64, the common
    # path (c = 1), retention (7, 3); inner loops 204 / 210 (above):
    #   retention      6 x (7 + 3 x (2 x 1 - 1)) = 60
    #   first group    10 + 1 + 2 x (19 - 1 + 1 x (7 + 64 + 204)) = 11 + 2 x 293 = 597
    #   other groups   (2 - 1) x (15 - 1 + 1 + 2 x (19 + 1 x (6 + 64 + 210))) = 15 + 598 = 613
    #   total          50 + 60 + 1 x (12 + 1 + 613 + 597) = 1333
    assert amp_cycles(16, 32, 32, 1, F16, BOW) == 1333
    # bf16 runs as f16.
    assert amp_cycles(16, 32, 32, 1, BF16, BOW) == 1333


def test_amp_cycles_float() -> None:
    # [16, 16] x [16, 32] in floats: IG = 16 / 8 = 2, OG = 2, weight loads 16 x (8 x 4 B) / 8
    # = 64, no retention saving (float activations), inner loops 432 / 290 (above):
    #   first group    11 + 2 x (18 + (7 + 64 + 432)) = 11 + 2 x 521 = 1053
    #   other groups   1 x (15 + 2 x (19 + (6 + 64 + 290))) = 15 + 758 = 773
    #   total          50 + 0 + (13 + 773 + 1053) = 1889
    assert amp_cycles(16, 16, 32, 1, F32, BOW) == 1889


def test_amp_cycles_batched() -> None:
    # Two conv groups (a batched matmul) of [16, 16] x [16, 16] halves: IG = OG = 1.
    #   retention      6 x (7 + 3 x (1 x 2 - 1)) = 60
    #   per group      12 + 1 + 0 + (11 + (18 + (7 + 64 + 204))) = 13 + 304 = 317
    #   total          50 + 60 + 2 x 317 = 744
    assert amp_cycles(16, 16, 16, 2, F16, BOW) == 744


@pytest.mark.parametrize(
    ("rows", "estimate", "measured"),
    [
        # Worker rows and inner loop (zeroing, half, -7 retention):
        #  16: 2,3,3,2,3,3 -> max(6 x 34, 6 x 30 + 14) = 204
        #  64: 10,11,11,10,11,11 -> n = 10: 37 + 28 - 7 = 58 -> 348; n = 11: 62 -> 372;
        #      max(372, 362) = 372
        #  96: 16 each -> 37 + 52 - 7 = 82 -> 492; max(492, 492 + 14) = 506
        #  2048: 341,341,342,341,341,342 -> n = 341: 37 + 1352 - 7 = 1382 -> 8292;
        #      n = 342: 1386 -> 8316; max(8316, 8306) = 8316
        # One group each way, so the total is 50 + 6 x 7 + (12 + 1) + (11 + 18 + 7 + 64 + inner)
        # = 205 + inner: 409, 577, 711, 8521.
        (16, 409, 402),
        (64, 577, 584),
        (96, 711, 716),
        (2048, 8521, 8525),
    ],
)
def test_amp_matches_the_tessellate_measurement(rows: int, estimate: int, measured: int) -> None:
    # tessellate-ipu's peak-flops notebook ran one ConvPartial1x1Out per tile on a Bow, fp16
    # [N, 16] x [16, 16]; its TFLOPS convert back to 402, 584, 716 and 8525 cycles a tile.
    # PopLibs' formula with its default 64-bit coefficient loads lands within 2% of each.
    assert amp_cycles(rows, 16, 16, 1, F16, BOW) == estimate
    assert abs(estimate - measured) / measured < 0.02


def test_partials_reduce_matches_poplibs() -> None:
    # 64 float outputs, 4 partials each, float result. `estimateConvReduceCycles`: one stage
    # (depth < 16); 64 % 4 == 0 and the partials are small, so the single-input path with
    # depth 4 - 1 = 3: loops 64 / 4 = 16, ceil(16 / 6) = 3 per worker; cycles per loop
    # 4 / min(4, 2 floats) = 2; overhead 8: (20 + (2 x 3 + 8) x 3) x 6 + 33 = 405.
    assert partials_reduce_cycles(64, 4, BOW) == 405
    # Into halves (a f16 matmul's result): the float-partials overhead is 7: (20 + 13 x 3) x 6
    # + 33 = 387.
    assert partials_reduce_cycles(64, 4, BOW, float_out=False) == 387
    # 30 outputs are not whole vectors of 4: the general vertex, depth 4 (none added into the
    # first), 3 cycles a partial per vector: loops 30 // 4 = 7, + 1 for each low bit of 30 % 4
    # = 2 -> 8; 8 // 6 = 1 per worker, and as 30 is not whole vectors the remainder runs a
    # shorter tail of 2 x 4 + 13 = 21: (32 + 21 + (3 x 4 + 7) x 1) x 6 = 432.
    assert partials_reduce_cycles(30, 4, BOW) == 432


def test_partials_reduce_in_stages() -> None:
    # `getMultiStageReducePlan`: one stage below 16 partials, two below 125, else three; each
    # intermediate depth is the integer part of depth ** ((stages - 1) / stages) or one more,
    # whichever needs fewer messages (depth / next + the rest of the plan's).
    # 16: next 4 (4 + 4 = 8) or 5 (16 / 5 + 5 = 8.2) -> (4,).
    # 100: 10 (10 + 10 = 20) or 11 (100 / 11 + 11 = 20.09) -> (10,).
    # 1472: three stages, next int(1472 ** (2 / 3)) = 129 (1472 / 129 + 129's plan (11,):
    # 129 / 11 + 11 = 22.73 -> 34.14) or 130 (11.32 + 130 / 11 + 11 = 34.14 + 0.09) -> (129, 11).
    assert reduce_plan(16) == (4,)
    assert reduce_plan(100) == (10,)
    assert reduce_plan(15) == ()
    assert reduce_plan(1472) == (129, 11)
    # 4096 outputs of 16 partials: two stages of 4. Stage one: 16384 outputs of 4 partials,
    # 3 x 16384 x 4 = 196,608 B is over 39,936, so the general vertex: loops 4096, 682 a
    # worker + 1: (32 + 19 x 683) x 6 = 78,054. Stage two: 4096 outputs, 3 x 16 KiB = 49,152 B
    # also over: loops 1024, 171 a worker (1024 = 6 x 170 + 4): (32 + 19 x 171) x 6 = 19,686.
    assert partials_reduce_cycles(4096, 16, BOW) == 78_054 + 19_686


def test_an_operand_is_regrouped_for_the_amp() -> None:
    # An operand whose contracted dim is not innermost on its tile is regrouped before the
    # vertex: PopLibs transposes it in [16, channels per group] matrices (`regroupTensor`).
    # [16, 64] x [64, 16] f32 on one tile, the lhs block to regroup: 16 x 64 = 1024 floats,
    # 1024 / (16 x 8) = 8 matrices of [16, 8]. Transpose2D's fast path (16 x 6 / 2 = 48 < 512):
    # 27 + M x (11 + 8 x (6 + 3 x 3)) with ceil(8 / 6) = 2 matrices a worker: 27 + 2 x 131 =
    # 289; x 6 = 1734. The AMP as in test_matmul_plan_picks_the_split_worked_out_by_hand: 3353.
    cycles = tile_cycles(problem(1, 16, 16, 64, F32, 4, F32, (True, False)), (1, 1, 1, 1), 1, BOW)
    assert (cycles.rearrange, cycles.amp) == (1734, 3353)
    # Halves, the rhs: 64 x 16 = 1024 halves, 4 matrices of [16, 16], fewer than the workers,
    # so `SplitTranspose1D` shares each matrix's 4 block rows: ceil(4 / (6 // 4)) = 4 a worker:
    # 27 + 4 x (12 + 4 x 2) = 107; 7 + 6 x (107 - 7) = 607.
    cycles = tile_cycles(problem(1, 16, 16, 64, F16, 4, F16, (False, True)), (1, 1, 1, 1), 1, BOW)
    assert cycles.rearrange == 607
    # In a program: an operand computed on the tiles ((a * 2) contracted over its first dim)
    # is regrouped in a step of kind "copy" before the matmul, on the matmul's tiles.
    report = compile_for(
        lambda a, b: jnp.einsum("km,kn->mn", a * 2, b), spec((64, 64)), spec((64, 64))
    ).cost_report()
    names = [(s.name, s.kind) for s in device_steps(report)]
    i = names.index(("dot_general.rearrange", "copy"))
    assert names[i + 1] == ("dot_general.matmul", "compute")
    assert device_steps(report)[i].compute_cycles > 0


def test_serial_chunks_accumulate_in_place() -> None:
    # [16, 64] x [64, 16] f32 on one tile, K in 2 serial chunks: 256 outputs, m = 43,
    # ADD FLOAT in place {1, true} with the assembly overhead 2: 22 loops x 3 = 66;
    # 6 x (58 + 66) + 11 = 755 per chunk, 2 x 755 = 1510.
    cycles = tile_cycles(problem(1, 16, 16, 64, F32, 4), (1, 1, 1, 1), 2, BOW)
    assert cycles.accumulate == 1510


# ---- on-tile copies ------------------------------------------------------------------------


def test_copy_cycles_by_atom() -> None:
    # REG (`experimentalConvTransformsEstimates`): cycles = 587 + 0.4404 a8 + 3.125 a4
    # + 5.1484 a2 for bytes in atoms of 8, 4 and 2 bytes.
    # 4 KiB in whole 8-byte words: 0.4404 x 4096 = 1803.9 -> 1804 (PopLibs' integer form
    # 451 x 4096 / 1024 = 1804 too): 2391.
    assert copy_cycles(4096, 8) == 587 + 1804
    assert copy_cycles(4096, 64) == 587 + 1804  # runs of 64 B are whole words
    # Runs of single floats: 3.125 x 4096 = 12,800 (3200 / 1024 exactly): 13,387.
    assert copy_cycles(4096, 4) == 587 + 12_800
    # Runs of single halves (a strided copy of an f16 tensor): 5.1484 x 4096 = 21,087.8
    # -> 21,088: 21,675, 9 times the contiguous copy. (PopLibs' integer form, 5271 / 1024 per
    # byte rounded down, gives 21,084: 4 cycles less.)
    assert copy_cycles(4096, 2) == 587 + 21_088
    assert copy_cycles(0, 8) == 0


def test_atom_bytes() -> None:
    assert atom_bytes(16) == 8
    assert atom_bytes(12) == 4
    assert atom_bytes(6) == 2
    assert atom_bytes(3) == 1  # single bytes: the 2-byte rate per element, twice per byte (A)


def test_transpose_half_fast_path() -> None:
    # Halves in whole 4 x 4 blocks run the `Transpose1D` MultiVertex (popops cycle estimators,
    # `TransposeWorkerCycles`): 7 supervisor cycles + 6 x (worker - 7), the slowest worker
    # taking ceil(matrices / 6) whole matrices: 29 + M x (18 + r4 x (12 + 4 x (c4 - 2))).
    # Six [16, 16] matrices, one per worker: 29 + 18 + 4 x (12 + 8) = 127; 7 + 6 x 120 = 727.
    assert transpose_cycles(6, 16, 16, 2, BOW) == 727
    # One [64, 16] matrix: fewer matrices than workers, so `SplitTranspose1D` shares its 16
    # block rows over the 6 workers, ceil(16 / 6) = 3 each: 27 + 3 x (12 + 4 x 2) = 87;
    # 7 + 6 x 80 = 487.
    assert transpose_cycles(1, 64, 16, 2, BOW) == 487


def test_transpose_half_4x4() -> None:
    # Six [4, 4] halves, one per worker (`TransposeWorkerCycles`, 1 x 1 blocks, one matrix):
    # 17 + 12 = 29; 7 + 6 x 22 = 139. Twelve, two each: 17 + 20 + 0 = 37; 7 + 6 x 30 = 187.
    assert transpose_cycles(6, 4, 4, 2, BOW) == 139
    assert transpose_cycles(12, 4, 4, 2, BOW) == 187


def test_transpose_float_fast_path() -> None:
    # Floats run `Transpose2D`, one vertex per worker (thread cycles x 6, no supervisor); with
    # even rows and cols within its strides: 27 + M x (11 + (rows / 2) x (6 + 3 x (cols / 2
    # - 1))). Six [16, 16] matrices: 27 + 11 + 8 x (6 + 21) = 254; x 6 = 1524.
    assert transpose_cycles(6, 16, 16, 4, BOW) == 1524
    # Twelve matrices: two per worker: 27 + 2 x (11 + 216) = 481; x 6 = 2886.
    assert transpose_cycles(12, 16, 16, 4, BOW) == 2886


def test_transpose_float_fast_path_stride_limit() -> None:
    # The fast path needs rows x (cols - 2) / 2 < 512 and rows < 512 (its largest strides).
    # Six [64, 64] floats: 64 x 62 / 2 = 1984, so the slow path
    # 13 + M x (8 + cols x (5 + rows x 4 / 2)) = 13 + 8 + 64 x 133 = 8533; x 6 = 51,198.
    assert transpose_cycles(6, 64, 64, 4, BOW) == 51_198


def test_transpose_half_slow_path() -> None:
    # Halves that are not whole 4 x 4 blocks: `Transpose2D`'s slow path, 15 + M x (8 + cols x
    # (5 + rows x 5 / 2)). Six [6, 10]: 15 + 8 + 10 x (5 + 15) = 223; x 6 = 1338.
    assert transpose_cycles(6, 6, 10, 2, BOW) == 1338


def test_multi_slice() -> None:
    # PE `getMultiSliceCycleEstimate` as PopLibs' slice planner calls it (DynamicSlice.cpp:
    # ceil(offsets / 6) offsets per worker): per worker 30 + offsets x (19 + vectors x 2),
    # x 6 workers; a vector is 2 floats (64 bits) or 2 halves.
    # 12 slices of 16 floats: 8 vectors, 2 offsets a worker: 30 + 2 x (19 + 16) = 100 -> 600.
    assert slice_cycles(12, 64, 4, BOW) == 600
    # 4 slices of 20 halves: 10 vectors, 1 offset a worker: 30 + 19 + 20 = 69 -> 414.
    assert slice_cycles(4, 40, 2, BOW) == 414
    # One slice of 1024 floats is split over the workers (`splitSingleRegion`): 512 vectors,
    # ceil(512 / 6) = 86 each: 30 + 19 + 172 = 221 -> 1326.
    assert slice_cycles(1, 4096, 4, BOW) == 1326


def test_fill_half() -> None:
    # Fill, one vertex per worker (PE `_fillCycleEstimate`, half, 3 or more elements):
    # 26 + size / (64 / 16). 96 halves: 16 a worker: 26 + 4 = 30; x 6 = 180.
    assert fill_cycles(96, F16, BOW) == 180


def test_fill_float() -> None:
    # 96 floats, 16 a worker: 16 + 8 + 6 + 0 + 1 = 31; x 6 = 186.
    assert fill_cycles(96, F32, BOW) == 186


# ---- whole programs on a 16-tile Bow ---------------------------------------------------------


def _only_step(compiled: ipujax.Compiled) -> ipujax.SuperstepCost:
    steps = device_steps(compiled.cost_report())
    assert len(steps) == 1, steps
    return steps[0]


def test_add_of_aligned_inputs_needs_no_exchange() -> None:
    # Linear layout of f32[4096] on 16 tiles: grain 8 B / 4 = 2 elements; at least
    # max(2, 128 B / 4) = 32 elements per tile; tiles used = min(16, 4096 // 32 = 128) = 16;
    # 4096 / 16 = 256 elements per tile (a whole number of grains). x goes on tiles 0..15; the
    # next linear tensor starts at 16 % 16 = 0, so y is on tiles 0..15 too, with the same layout.
    # The add follows x's layout, y is already there: nothing moves, exchange 0 cycles.
    # Compute: BinaryOp1D ADD FLOAT on 256 elements a tile, 581 (test_binary_f32_add).
    compiled = compile_for(lambda x, y: x + y, spec((4096,)), spec((4096,)))
    step = _only_step(compiled)
    assert step.name == "add"
    assert step.op == "add"
    assert step.tiles == 16
    assert step.flops == 4096
    assert step.compute_cycles == 581
    assert step.exchange_cycles == 0
    assert step.exchange_bytes == 0
    assert step.sync_cycles == 90
    report = compiled.cost_report()
    assert device_cycles(report) == 581 + 0 + 90
    assert report.exchange_bytes == 0
    assert [lay.start for lay in compiled.program.input_layouts] == [0, 0]


def test_add_of_inputs_on_different_tiles_exchanges_one_block() -> None:
    # f32[256] on 16 tiles: at least 32 elements per tile, tiles used = min(16, 256 // 32) = 8,
    # block 256 / 8 = 32 elements. x is on tiles 0..7, so the next tensor starts at tile 8:
    # y is on tiles 8..15. The add follows x (tiles 0..7), so every tile of the add receives
    # y's block: 32 x 4 B = 128 B -> ceil(128 / 4) + 100 = 132 cycles; 8 tiles x 128 B = 1024 B
    # in all. Compute: 32 elements a tile, m = ceil(32 / 6) = 6, ceil(6 / 2) = 3 loops x 3 = 9;
    # 6 x (29 + 9) + 11 = 239.
    compiled = compile_for(lambda x, y: x + y, spec((256,)), spec((256,)))
    assert [(lay.start, lay.tiles) for lay in compiled.program.input_layouts] == [(0, 8), (8, 8)]
    step = _only_step(compiled)
    assert step.tiles == 8
    assert step.exchange_cycles == 32 + 100
    assert step.exchange_bytes == 8 * 128
    assert step.compute_cycles == 239
    assert step.sync_cycles == 90
    assert device_cycles(compiled.cost_report()) == 132 + 90 + 239


def test_exp_runs_the_unrolled_unary_vertex() -> None:
    # f32[4096] on 16 tiles: 256 elements per tile (as above); UnaryOp1D EXPONENT FLOAT: 1010
    # (test_unary_exp_is_unrolled).
    step = _only_step(compile_for(jnp.exp, spec((4096,))))
    assert step.op == "exponential"
    assert step.compute_cycles == 1010
    assert step.exchange_cycles == 0
    assert step.sync_cycles == 90


def test_f16_add_uses_four_lanes() -> None:
    # f16[4096]: grain 8 / 2 = 4 elements, at least max(4, 128 / 2 = 64) per tile, tiles used
    # min(16, 4096 // 64) = 16, 256 elements each; both inputs on tiles 0..15.
    # Compute: BinaryOp1D ADD HALF on 256 elements, 365 (test_binary_f16_add).
    step = _only_step(compile_for(lambda x, y: x + y, spec((4096,), F16), spec((4096,), F16)))
    assert step.tiles == 16
    assert step.compute_cycles == 365
    assert step.exchange_cycles == 0


def test_sum_reduces_in_stages() -> None:
    # jnp.sum of f32[4096] on 16 tiles: one kept row, depth 4096. The reduce rule spreads the
    # depth over gq = 1, 2, 4, 8, 16 tiles (the 1 row leaves all 16 spare), costing the
    # exchange of each tile's block of 4096 / gq floats, stage one (contiguous) on it, and for
    # gq > 1 each combining stage: the exchange of its partials, a sync, and a strided reduce of
    # them (PopLibs' `getMultiStageReducePlan`: one stage below 16 partials, two from 16, of
    # ceil(sqrt(16)) = 4 each).
    #
    # Stage one, one output: the workers split its partials (6 // 1 = 6 ways) and add the six
    # runs up (12 + 6, A); per worker ceil(run / 2) + 12 + 17 (+ 2 if run is odd) + 18, x 6:
    #   gq = 1:  run ceil(4096 / 6) = 683 (odd): 342 + 12 + 17 + 2 + 18 = 391 -> 2346
    #   gq = 2:  run 342: 171 + 47 = 218 -> 1308
    #   gq = 4:  run 171 (odd): 86 + 49 = 135 -> 810
    #   gq = 8:  run 86: 43 + 47 = 90 -> 540
    #   gq = 16: run 43 (odd): 22 + 49 = 71 -> 426
    # Combining d partials of the one output (StridedReduce, test_reduce_strided: 16 + 3 + 5
    # + (3 + d - 1) = 26 + d, x 6): exchange d x 4 B.
    #   gq   block exchange        stage one  combining                              total
    #   1    16384 B: 4096 + 100   2346       -                                      6542
    #   2    8192 B: 2048 + 100    1308       102 + 90 + 6 x 28 = 360                3816
    #   4    4096 B: 1024 + 100    810        104 + 90 + 6 x 30 = 374                2308
    #   8    2048 B: 512 + 100     540        108 + 90 + 6 x 34 = 402                1554
    #   16   none (next test)      426        two of 4: 2 x (104 + 90 + 180) = 748   1174
    # -> gq = 16.
    # Stage one ("local") on the 16 tiles, 256 elements each: 426.
    # Combining 16 partials in two stages of 4: first on 4 tiles, each receiving 4 partials of
    # 4 B (16 B -> 4 + 100 = 104 cycles) and reducing them (180); then on the output's single
    # tile, the same: 104 and 180. A sync of 90 each.
    report = compile_for(jnp.sum, spec((4096,))).cost_report()
    local, stage, combine = device_steps(report)
    assert (local.name, stage.name, combine.name) == (
        "reduce.local",
        "reduce.combine.stage1",
        "reduce.combine",
    )
    assert (local.tiles, local.compute_cycles, local.sync_cycles) == (16, 426, 90)
    assert local.flops == 4096  # one per input element
    assert (stage.tiles, stage.exchange_cycles, stage.exchange_bytes) == (4, 104, 4 * 16)
    assert (stage.compute_cycles, stage.sync_cycles, stage.flops) == (180, 90, 4 * 4)
    assert (combine.tiles, combine.exchange_cycles, combine.exchange_bytes) == (1, 104, 16)
    assert (combine.compute_cycles, combine.sync_cycles, combine.flops) == (180, 90, 4)


def test_sum_of_a_vector_reduces_its_blocks_in_place() -> None:
    # f32[4096] lies on tiles 0..15, 256 elements each; the reduce's grid over (1, 4096) is
    # (1, 16), 256 elements on each of tiles 0..15: nothing moves, exchange 0.
    local, *_ = device_steps(compile_for(jnp.sum, spec((4096,))).cost_report())
    assert local.exchange_cycles == 0


# ---- matmul planning -----------------------------------------------------------------------


def _hand_amp(rows: int, depth: int, cols: int, groups: int, half: bool) -> int:
    """PopLibs' `getConvPartial1x1SupervisorCycleEstimate` for one tile, written out again from
    lib/poplin/PerformanceEstimation.hpp for the Bow: 6 workers, 16 conv units, float partials
    (the common path), retention savings (7, 3) for half inputs, 64 cycles of weight loads."""
    per_worker = [(i + 1) * rows // 6 - i * rows // 6 for i in range(6)]

    def worker(n: int, zeroing: bool) -> int:
        if not half:  # float activations: core 8, zeroCyclesPerGroup 8
            if n == 0:
                return 24
            zero = 2 + 8 * n if zeroing else 0
            return (47 if n == 1 else 46) + zero + max(0, n - 3) * 8
        if n < 3:
            return (20, 31, 40)[n] + (1 if zeroing else 2) - 7
        return (37 if zeroing else 38) + (n - 3) * 4 - 7

    def inner(zeroing: bool) -> int:
        cycles = [6 * worker(n, zeroing) for n in per_worker]
        return max(max(cycles), min(cycles) + 14)

    in_groups = -(-depth // (16 if half else 8))
    out_groups = -(-cols // 16)
    loads = 16 * 32 // 8  # 16 halves or 8 floats = 32 B per conv unit
    retention = 6 * (7 + 3 * (in_groups * groups - 1)) if half else 0
    others = (in_groups - 1) * (15 - 1 + 1 + out_groups * (19 + 6 + loads + inner(False)))
    first = 10 + 1 + out_groups * (19 - 1 + 7 + loads + inner(True))
    return 50 + retention + groups * (12 + 1 + others + first)


def _hand_cycles(
    t: ipujax.Target,
    size: tuple[int, int, int, int],
    split: tuple[int, ...],
    serial: int,
    item: int,
) -> tuple[int, int]:
    """The documented plan cost (`matmul_plan.tile_cycles` and `_evaluate`), written out again:
    exchange of both operand blocks + sync + the AMP vertex per serial chunk (rows and output
    channels swapped if that is faster: PopLibs' `swapOperands`) + an f32 add of the partials
    per chunk when K runs serially; a K split adds the exchange of k partial blocks shared by
    min(k, cols / n) tiles, a sync and their reduction. f32 results (no cast), no operand to
    rearrange. Returns (cycles, temporary bytes)."""
    (batch, rows, cols, depth), (b, m, n, k) = size, split
    bb, mb, nb, kb = (-(-batch // b), -(-rows // m), -(-cols // n), -(-depth // k))
    received = (bb * mb * kb + bb * kb * nb) * item
    partials = bb * mb * nb * 4
    outputs = bb * mb * nb
    chunk = -(-kb // serial)
    half = item <= 2
    amp = serial * min(_hand_amp(mb, chunk, nb, bb, half), _hand_amp(nb, chunk, mb, bb, half))
    cycles = (math.ceil(received / 4) + 100) + 90 + amp
    if serial > 1:  # BinaryOp1DInPlace ADD FLOAT over the outputs, once per chunk
        cycles += serial * (6 * (58 + math.ceil(math.ceil(outputs / 6) / 2) * 3) + 11)
    if k > 1:
        spread = min(k, -(-cols // n))
        share = bb * mb * -(-cols // (n * spread))
        cycles += _hand_reduce(share, k)
        cycles += math.ceil(k * -(-partials // spread) / 4) + 100 + 90
    temp = received // serial + partials * (2 if k > 1 else 1)
    return cycles, temp


def _hand_reduce_vertex(outputs: int, depth: int) -> int:
    """One stage of `depth` float partials into float results (AMP `getReduceCycleEstimate`):
    the single-input vertex when the outputs are whole vectors of 4 and the partials take
    under 1/16 of the tile (638,976 / 16 = 39,936 B), counting depth - 1 partials; else the
    general one, 3 cycles a partial per vector and a tail for a part vector."""
    if outputs % 4 == 0 and (depth - 1) * outputs * 4 < 39_936:
        return (20 + (2 * (depth - 1) + 8) * math.ceil(outputs // 4 / 6)) * 6 + 33
    loops = outputs // 4 + bin(outputs % 4).count("1")
    per_worker, cycles = loops // 6, 32
    if loops % 6:
        if outputs % 4:
            cycles += 2 * depth + 13
        else:
            per_worker += 1
    return (cycles + (3 * depth + 7) * per_worker) * 6


def _hand_reduce(share: int, k: int) -> int:
    """`estimateConvReduceCycles` for the K splits of a 16-tile plan: one stage below 16
    partials; 16 in two stages of 4 (`getMultiStageReducePlan`: 4 + 4 messages beat 16),
    the first over 4 x share outputs."""
    if k < 16:
        return _hand_reduce_vertex(share, k)
    assert k == 16
    return _hand_reduce_vertex(4 * share, 4) + _hand_reduce_vertex(share, 4)


def _hand_best(t: ipujax.Target, size: tuple[int, int, int, int], item: int) -> int:
    """The fewest cycles over power-of-two splits (and whole dims) that fit the budget."""
    tiles = t.tiles_per_ipu

    def options(s: int) -> set[int]:
        found = {p for p in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if p <= min(s, tiles)}
        return found | ({s} if s <= tiles else set())

    best = None
    for split in itertools.product(*(options(s) for s in size)):
        if math.prod(split) > tiles:
            continue
        kb = -(-size[3] // split[3])
        for serial in (s for s in (1, 2, 4, 8, 16) if kb % s == 0):
            cycles, temp = _hand_cycles(t, size, split, serial, item)
            if temp <= 0.6 * t.bytes_per_tile and (best is None or cycles < best):
                best = cycles
    assert best is not None
    return best


def test_matmul_plan_64_cubed_f32_on_16_tiles() -> None:
    t = target(16)
    plan = plan_matmul(1, 64, 64, 64, F32, 4, t)
    assert plan.tiles <= 16
    assert plan.temp_bytes_per_tile <= 383_385  # 0.6 x 638,976, rounded down
    cycles, temp = _hand_cycles(
        t, (1, 64, 64, 64), (plan.b, plan.m, plan.n, plan.k), plan.serial, 4
    )
    assert plan.cycles == cycles
    assert plan.temp_bytes_per_tile == temp
    assert plan.cycles == _hand_best(t, (1, 64, 64, 64), 4)


def test_matmul_plan_picks_the_split_worked_out_by_hand() -> None:
    # For 64x64x64 f32 on 16 tiles the 4 x 4 output grid (b=1, m=4, n=4, k=1, serial 1) gives
    # each tile a [16, 64] x [64, 16] block pair: received (16*64 + 64*16) x 4 = 8192 B ->
    # 2048 + 100 = 2148; sync 90. The AMP, float inputs: IG = 64 / 8 = 8, OG = 1, inner loops
    # 432 / 290 (test_inner_loop_cycles), loads 64:
    #   first group    11 + (18 + (7 + 64 + 432)) = 532
    #   other groups   7 x (15 + (19 + (6 + 64 + 290))) = 7 x 394 = 2758
    #   total          50 + (13 + 2758 + 532) = 3353 (swapped, [16, 64] x [64, 16] again)
    # 2148 + 90 + 3353 = 5591 cycles; temporaries 8192 + 16*16*4 = 9216 B per tile.
    plan = plan_matmul(1, 64, 64, 64, F32, 4, target(16))
    assert (plan.b, plan.m, plan.n, plan.k, plan.serial) == (1, 4, 4, 1, 1)
    assert plan.cycles == 5591
    assert plan.temp_bytes_per_tile == 9216
    assert not plan.swap


def test_matmul_program_costs_and_flops() -> None:
    # The compiled a @ b runs the plan worked out above as one superstep. Its operands are
    # program inputs, created in the matmul's layout (PopLibs' `createMatMulInputLHS/RHS`): each
    # [16, 64] block is spread over the share = 4 tiles that read it, so a tile holds 1/4 of
    # each block and receives the rest: 2 x (4096 - 1024) = 6144 B -> 1536 + 100 = 1636 cycles;
    # 16 tiles x 6144 B exchanged. Compute 3353, sync 90: 1636 + 90 + 3353 = 5079.
    compiled = compile_for(lambda a, b: a @ b, spec((64, 64)), spec((64, 64)))
    assert [(lay.tiles, lay.block) for lay in compiled.program.input_layouts] == [
        (16, (16, 16)),
        (16, (16, 16)),
    ]
    report = compiled.cost_report()
    dots = [s for s in report.supersteps if s.op == "dot_general"]
    assert sum(s.flops for s in dots) == 2 * 64 * 64 * 64
    (step,) = dots
    assert step.tiles == 16
    assert step.exchange_cycles == 1636
    assert step.sync_cycles == 90
    assert step.compute_cycles == 3353
    assert step.exchange_bytes == 16 * 6144
    assert device_cycles(report) == 5079
    assert report.flops == 2 * 64**3
    assert report.peak_flops_per_cycle == 32  # an f32 matmul program


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")  # about the matmul, not the host
def test_matmul_with_k_split_reduces_partials() -> None:
    # [8, 4096] x [4096, 8] f32 on 16 tiles: the K split over all 16 tiles (1, 1, 1, 16) gives
    # each tile [8, 256] x [256, 8]. Exchange: (8 x 256 x 2) x 4 = 16,384 B -> 4096 + 100 = 4196.
    # The AMP, float inputs: 8 rows over the workers 1,1,2,1,1,2:
    #   zeroing    n = 1: 47 + (2 + 8) = 57 -> 342; n = 2: 46 + 18 = 64 -> 384;
    #              max(384, 342 + 14) = 384
    #   no zeroing n = 1: 47 -> 282; n = 2: 46 -> 276; max(282, 276 + 14) = 290
    #   IG = 256 / 8 = 32, OG = 1: first 11 + (18 + (7 + 64 + 384)) = 484;
    #   others 31 x (15 + (19 + (6 + 64 + 290))) = 31 x 394 = 12,214; total 50 + 13 + 12,214
    #   + 484 = 12,761.
    # The partials: the 8 output columns' reduction is spread over min(16, 8) = 8 tiles, one
    # column (8 outputs) each, receiving 16 partial blocks of 8 x 4 B = 512 B -> 128 + 100 = 228
    # cycles; reducing 16 partials of 8 outputs in two stages of 4 (`estimateConvReduceCycles`),
    # single-input vertices counting 3 partials, overhead 8: first 32 outputs, ceil(8 / 6) = 2
    # loops a worker: (20 + (6 + 8) x 2) x 6 + 33 = 321; then 8 outputs, 1 loop: (20 + 14) x 6
    # + 33 = 237; 558 in all.
    # Plan: 4196 + 90 + 12,761 + 558 + 228 + 90 = 17,923.
    t = target(16)
    plan = plan_matmul(1, 8, 8, 4096, F32, 4, t)
    assert plan.cycles == _hand_best(t, (1, 8, 8, 4096), 4) == 17_923
    assert (plan.b, plan.m, plan.n, plan.k) == (1, 1, 1, 16)
    # In the program the operands are created in the matmul's layout with nothing shared
    # (share n = m = 1), so the matmul step exchanges nothing: 0 + 90 + 12,761, then the
    # reduction 228 + 90 + 558: 13,727.
    report = compile_for(lambda a, b: a @ b, spec((8, 4096)), spec((4096, 8))).cost_report()
    matmul, reduce = device_steps(report)
    assert matmul.name == "dot_general.matmul"
    assert reduce.name == "dot_general.reduce_partials"
    assert matmul.flops == 2 * 8 * 8 * 4096
    assert (matmul.tiles, matmul.exchange_cycles, matmul.compute_cycles) == (16, 0, 12_761)
    assert (reduce.tiles, reduce.exchange_cycles, reduce.compute_cycles) == (8, 228, 558)
    assert reduce.flops == 16 * 8 * 8  # 16 partials of each of the 64 outputs
    assert device_cycles(report) == 13_727


def test_f16_matmul_plan_uses_the_fast_amp() -> None:
    # [16, 64] x [64, 16] halves on each tile of the 4 x 4 grid: IG = 64 / 16 = 4, OG = 1,
    # inner loops 204 / 210 (test_inner_loop_cycles):
    #   retention 6 x (7 + 3 x (4 - 1)) = 96; first 11 + (18 + (7 + 64 + 204)) = 304;
    #   others 3 x (15 + (19 + (6 + 64 + 210))) = 942; total 50 + 96 + 13 + 942 + 304 = 1405.
    # Exchange (16*64 + 64*16) x 2 B = 4096 B -> 1124; plan 1124 + 90 + 1405 = 2619.
    t = target(16)
    plan = plan_matmul(1, 64, 64, 64, F16, 4, t)
    split = (plan.b, plan.m, plan.n, plan.k)
    assert (plan.cycles, plan.temp_bytes_per_tile) == _hand_cycles(
        t, (1, 64, 64, 64), split, plan.serial, 2
    )
    assert plan.cycles == _hand_best(t, (1, 64, 64, 64), 2) == 2619
    assert plan.cycles < plan_matmul(1, 64, 64, 64, F32, 4, t).cycles


def test_f16_matmul_program_casts_its_partials() -> None:
    # f16 @ f16 -> f16: the plan above, then the float partials cast to halves on the same
    # tiles (Cast1D of the 256 outputs, 390: test_cast_f32_to_f16).
    # Matmul step: each tile receives 3/4 of both [16, 64] f16 blocks: 2 x (2048 - 512) =
    # 3072 B -> 768 + 100 = 868; compute 1405; sync 90. Cast step: 390 + sync 90.
    # 868 + 90 + 1405 + 390 + 90 = 2843.
    # (PopLibs' planner charges the output cast as `estimateCastCycles`: (max(ceil(43 / 2),
    # ceil(43 / 4)) + 26) x 6 = 288; the code charges the Cast1D vertex.)
    report = compile_for(lambda a, b: a @ b, spec((64, 64), F16), spec((64, 64), F16)).cost_report()
    matmul, cast = device_steps(report)
    assert (matmul.name, cast.name) == ("dot_general.matmul", "dot_general.cast")
    assert (matmul.exchange_cycles, matmul.compute_cycles) == (868, 1405)
    assert (cast.tiles, cast.exchange_cycles, cast.compute_cycles) == (16, 0, 390)
    assert device_cycles(report) == 2843
    assert report.peak_flops_per_cycle == 128


def test_matmul_plan_stays_in_budget_when_large() -> None:
    # A [512, 4096] x [4096, 512] f32 matmul on 16 tiles cannot hold whole operands per tile
    # (the 4 x 4 output grid alone would need (128*4096*2) x 4 B = 4 MiB); the plan must split
    # K (over tiles or serially) to fit 383,385 B.
    t = target(16)
    plan = plan_matmul(1, 512, 512, 4096, F32, 4, t)
    assert plan.temp_bytes_per_tile <= 383_385
    assert plan.tiles <= 16
    split = (plan.b, plan.m, plan.n, plan.k)
    assert (plan.cycles, plan.temp_bytes_per_tile) == _hand_cycles(
        t, (1, 512, 512, 4096), split, plan.serial, 4
    )
    assert plan.cycles == _hand_best(t, (1, 512, 512, 4096), 4)


# ---- the report's totals -------------------------------------------------------------------


def _softmax(x: jnp.ndarray) -> jnp.ndarray:
    return jnp.exp(x - x.max(-1, keepdims=True)) / jnp.exp(x).sum(-1, keepdims=True)


def test_report_totals_are_the_sums_of_supersteps() -> None:
    report = compile_for(_softmax, spec((8, 64))).cost_report()
    steps = report.supersteps
    assert len(steps) > 3
    assert report.total_cycles == sum(
        s.compute_cycles + s.exchange_cycles + s.sync_cycles + s.link_cycles for s in steps
    )
    assert report.flops == sum(s.flops for s in steps)
    assert report.exchange_bytes == sum(s.exchange_bytes for s in device_steps(report))
    assert report.seconds == report.total_cycles / 1.85e9
    by_op = report.cycles_by_op()
    assert sum(c for _, c in by_op) == report.total_cycles
    assert [c for _, c in by_op] == sorted((c for _, c in by_op), reverse=True)
    assert {op for op, _ in by_op} == {s.op for s in steps}


def test_host_transfers_by_hand() -> None:
    # The aligned f32[4096] add returns no argument updated, so both arguments come from the
    # host and the sum goes back: 32,768 B in, 16,384 B out, each after 50,000 cycles of
    # latency at 7 GB/s (docs/target.md): 32,768 x 1.85e9 / 7e9 = 8,660.1 -> 8,661 cycles and
    # 16,384 x 1.85e9 / 7e9 = 4,330.1 -> 4,331. On the IPU: 581 + 90 = 671 (above).
    report = compile_for(lambda x, y: x + y, spec((4096,)), spec((4096,))).cost_report()
    first, *_, last = report.supersteps
    assert (first.name, first.kind, first.exchange_bytes) == ("host: inputs", "host", 32_768)
    assert first.link_cycles == 50_000 + 8_661
    assert (last.name, last.exchange_bytes, last.link_cycles) == ("host: outputs", 16_384, 54_331)
    assert report.host_bytes == 32_768 + 16_384
    assert report.total_cycles == 671 + 58_661 + 54_331
    assert report.time_split()["host"] == pytest.approx((58_661 + 54_331) / 1.85e9)


def test_state_the_program_returns_stays_on_the_device() -> None:
    # w is returned updated (same shape and dtype): it stays on the device; only x comes in
    # (64 x 4 = 256 B) and the loss goes out (4 B).
    def sgd(w, x):
        loss, g = jax.value_and_grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
        return w - 0.1 * g, loss

    report = compile_for(sgd, spec((64, 64)), spec((1, 64))).cost_report()
    first, *_, last = report.supersteps
    assert (first.exchange_bytes, last.exchange_bytes) == (256, 4)


def test_utilisation_by_hand() -> None:
    # The aligned f32[4096] add: 4096 FLOPs on 16 tiles whose f32 peak is 32 FLOP/cycle, in
    # 671 cycles on the IPU and 113,663 with the host transfers above:
    # 4096 / (32 x 16 x 113,663).
    report = compile_for(lambda x, y: x + y, spec((4096,)), spec((4096,))).cost_report()
    assert report.flop_utilisation == pytest.approx(4096 / (32 * 16 * 113_663))
    assert report.seconds == pytest.approx(113_663 / 1.85e9)
    assert report.bytes_per_tile == BOW_BYTES_PER_TILE
    assert (report.tiles_per_ipu, report.ipus, report.clock_hz) == (16, 1, 1.85e9)


def test_mk1_clock_sets_seconds() -> None:
    mesh = ipujax.make_mesh((1,), ("ipu",), target=ipujax.Target.mk1().with_tiles(16))
    x = spec((4096,))
    report = ipujax.jit(lambda a, b: a + b, mesh=mesh).lower(x, x).compile().cost_report()
    assert report.target == "mk1"
    # The same six workers and 64-bit vectors as Bow: 581 + 0 + 90 = 671 cycles on the IPU, at
    # 1.6 GHz; the host transfers take as long in seconds, so more cycles.
    assert device_cycles(report) == 671
    assert report.seconds == report.total_cycles / 1.6e9

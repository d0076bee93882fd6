"""Matmuls on the horizontal MAC vertex, as PopLibs estimates them (docs/target.md, "Matmuls on
the MAC vertices").

PopLibs' convolution planner weighs every vertex that can run a tile's block and keeps the
cheapest plan (`getConvVertexTypeCandidates` in `lib/poplin/ConvVertexType.cpp` lists AMP,
SLIC, HMAC, VMAC and outer-product candidates; `lib/poplin/ConvModel.cpp` costs each). Besides
the AMP (`cost.amp`), the one that serves matmuls is `ConvPartialHorizontalMac`: each worker
takes a run of output positions and, for each position and output channel, the dot product of
its input channels with that channel's weights on the 64-bit data path (2 floats or 4 halves a
cycle), into float partials. Output channels come one at a time (`partialChansPerGroup` 1 with
float partials), so a product with one output column pays for one column where the AMP pads
it to 16. Half inputs of a 1x1 product run the `ConvPartialHorizontalMac1x1` specialisation.

The formulas are PopLibs' estimators in `lib/poplin/PerformanceEstimation.hpp` (graphcore/
poplibs at 7eac0f26): `getDenseDotProductCycles`, `getConvPartialHorizontalMacCycleEstimate`,
`estimateConvPartialHorizontalMacInnerLoopCycles` (the planner's worker split),
`getConvPartialHorizontalMacSupervisorInnerLoopCycleEstimate` and `...OuterLoopCycleEstimate`,
and `estimateZeroSupervisorCycles`, combined as the planner's `Plan::Hmac` case in
`ConvModel.cpp` combines them. `ConvPartialVerticalMac` is not modelled: it has no float path
(its candidates are skipped for float inputs) and serves grouped convolutions with one output
channel per group, not matmuls.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from partitioner.target import Target

_WORKER_NON_LOOP = 16  # per worker, outside the loops (`...SupervisorInnerLoopCycleEstimate`)
_PARTIALS_ZEROING_SAVED = 9  # float partials (`zeroPartialsRetentionSavings`)


def _half(dtype: np.dtype) -> bool:
    """f16 (and bf16, costed as f16 as on the AMP) loads 4 a cycle; f32 2."""
    return np.dtype(dtype).itemsize <= 2


def _vector_width(half: bool, target: Target) -> int:
    """Activations one 64-bit load brings (`target.getVectorWidth`): 4 halves or 2 floats."""
    return target.vector_bytes_per_cycle // (2 if half else 4)


def dot_cycles(size: int, half: bool, target: Target) -> int:
    """One worker's dot product of `size` input channels into a float partial
    (`getDenseDotProductCycles`): 7 cycles around the loop (repeat, wind-down, adding into the
    partial, branch), then a cycle per widest vector that divides `size`; below a full 64-bit
    vector, activations and weights cannot load together, so two cycles per vector and one
    more to warm up. Half inputs save a cycle."""
    full = _vector_width(half, target)
    width = full
    while size % width:
        width //= 2
    per_vector, warm_up = (1, 0) if width >= full else (2, 1)
    return 7 + warm_up + (size // width) * per_vector - half


def chans_per_group(depth: int, half: bool, target: Target) -> int:
    """The input channels of one group: the tile's whole depth, padded to a full vector. The
    planner tries every grouping (`getConvVertexHMACCandidates`); one group per tile has the
    fewest per-group overheads, and a padded vector runs the 64-bit loop, never the slower
    narrow one (A: docs/target.md, "Matmuls on the MAC vertices")."""
    width = _vector_width(half, target)
    return -(-depth // width) * width


def _busiest_runs(field_rows: int, width: int, workers: int) -> list[int]:
    """The output runs of the busiest worker for one kernel position, as the planner splits
    a tile's `field_rows` rows of `width` outputs
    (`estimateConvPartialHorizontalMacInnerLoopCycles`): rows cut into pieces so that there
    are a multiple of `workers`, the busiest worker taking its share of whole rows and then
    of pieces."""
    split = workers // math.gcd(workers, field_rows)
    most = -(-field_rows * split // workers)
    runs = [width] * (most // split) if width else []
    if width and most % split:
        runs.append((most % split) * -(-width // split))
    return runs


def _worker_cycles(
    runs: list[int], kernel_positions: int, chans: int, half: bool, one_by_one: bool, t: Target
) -> int:
    """One worker's cycles over its runs at every kernel position, one output channel
    (`getConvPartialHorizontalMacCycleEstimate`): per run 19 cycles (13 for the 1x1 vertex)
    and per output 7 (2) around the dot product; 16 less the state the worker retains (6 for
    halves, 15 on the 1x1 vertex), and 16 outside the loops."""
    retained = 15 if one_by_one else (6 if half else 0)
    per_run, per_output = (13 + 1, 2) if one_by_one else (19, 7)
    dot = dot_cycles(chans, half, t)
    cycles = 16 - retained + _WORKER_NON_LOOP
    for _ in range(kernel_positions):
        cycles += sum(per_run + run * (per_output + dot) if run else 7 for run in runs)
    return cycles


def _zeroing_cycles(outputs: int, out_groups: int, groups: int, t: Target) -> int:
    """Zeroing the float partials before the first group (`estimateZeroSupervisorCycles`):
    each worker a sixth of the outputs, two floats a cycle, 14 cycles less the 9 retained."""
    workers = t.threads_per_tile
    per_worker = -(-outputs // workers)
    vectors = -(-per_worker // _vector_width(False, t))
    return (vectors + 14 - _PARTIALS_ZEROING_SAVED) * workers * out_groups * groups


@functools.lru_cache(maxsize=65536)
def mac_cycles(
    rows: int,
    depth: int,
    cols: int,
    groups: int,
    dtype: np.dtype,
    target: Target,
    field_rows: int = 1,
    kernel_positions: int = 1,
) -> int:
    """One tile's `ConvPartialHorizontalMac` vertex: `groups` products of `rows` outputs (in
    `field_rows` rows of the field; 1 for a matmul, whose rows PopLibs flattens into one)
    by `cols` output channels, each output the dot product of `depth` input channels at each
    of `kernel_positions`, into float partials: the planner's `Plan::Hmac` estimate."""
    half = _half(dtype)
    one_by_one = half and field_rows == 1 and kernel_positions == 1
    workers = target.threads_per_tile
    width = -(-rows // field_rows)
    runs = _busiest_runs(field_rows, width, workers)
    chans = chans_per_group(depth, half, target)
    inner = workers * _worker_cycles(runs, kernel_positions, chans, half, one_by_one, target)
    # The outer loop: per call, the retained state restored by each worker (the planner
    # passes the partials' type where the activations' belongs, so halves restore none but
    # on the 1x1 vertex); per conv group 23, per input group 15, per output channel 10.
    overhead = (58 if not half else 65) - 10 * one_by_one
    restored = workers * (_PARTIALS_ZEROING_SAVED + (15 if one_by_one else 0))
    cycles = overhead + restored + groups * (23 + 15 + cols * (10 + inner))
    if not one_by_one:  # the 1x1 vertex writes its single input group's partials unzeroed
        cycles += _zeroing_cycles(field_rows * width, cols, groups, target)
    return cycles

"""Matmuls on the AMP units, as PopLibs estimates them (docs/target.md, "Compute").

PopLibs runs a matmul as a 1x1 convolution: on each tile one `ConvPartial1x1Out` vertex takes
the tile's rows (the field, split evenly over the six workers), its input channels in groups of
16 halves or 8 floats, its output channels in groups of 16, and its conv groups (the batch of a
batched matmul). The cycle formulas below are those of its estimator,
`getConvPartial1x1SupervisorCycleEstimate` and the functions it calls in PopLibs'
`lib/poplin/PerformanceEstimation.hpp`; they match cycles measured on a Bow to within 2%
(docs/fidelity.md). A split of K over tiles leaves partial sums that further supersteps reduce
(`partials_reduce_cycles`, PopLibs' `getReduceCycleEstimate`), and float partials of a half
matmul are cast back (`cast_cycles` in `cost.vector`).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from partitioner.target import Target


def _half(dtype: np.dtype) -> bool:
    """f16 (and bf16, which the IPU lacks and ipujax costs as f16) runs the fast AMP path."""
    return np.dtype(dtype).itemsize <= 2


def in_chans_per_group(target: Target, dtype: np.dtype) -> int:
    return target.amp_in_chans_half if _half(dtype) else target.amp_in_chans_float


def _worker_rows(rows: int, workers: int) -> list[int]:
    """PopLibs' even split of a tile's rows over its workers (`partitionConvPartialByWorker`)."""
    return [(i + 1) * rows // workers - i * rows // workers for i in range(workers)]


def _worker_cycles(rows: int, zeroing: bool, half: bool) -> int:
    """One worker's cycles for `rows` output rows of one (input, output) channel group pass,
    on the common path (half inputs with 16 conv units, or float partials); half inputs keep
    state between passes and save 7 cycles."""
    if not half:  # float activations: the 8-cycle core, partials zeroed on the first pass
        zero = (2 + 8 * rows) if zeroing and rows else 0
        if rows < 3:
            return {0: 24, 1: 47, 2: 46}[rows] + zero
        return 46 + zero + (rows - 3) * 8
    step = 1 if zeroing else 2
    if rows < 3:
        return {0: 20, 1: 31, 2: 40}[rows] + step - 7
    return (37 if zeroing else 38) + (rows - 3) * 4 - 7


def inner_loop_cycles(rows: int, zeroing: bool, half: bool, target: Target) -> int:
    """A pass over the rows by all workers, in tile cycles: the slowest worker's cycles times
    the number of workers (the barrel schedule), at least the least busy one's plus 14."""
    workers = target.threads_per_tile
    cycles = [workers * _worker_cycles(r, zeroing, half) for r in _worker_rows(rows, workers)]
    return max(max(cycles), min(cycles) + 14)


@functools.lru_cache(maxsize=65536)
def amp_cycles(
    rows: int, depth: int, cols: int, groups: int, dtype: np.dtype, target: Target
) -> int:
    """One tile's `ConvPartial1x1Out` vertex: `groups` matmuls of [rows, depth] x [depth, cols]
    into float partials (the outer loop of PopLibs' estimator, with its weight loads)."""
    half = _half(dtype)
    in_groups = math.ceil(depth / in_chans_per_group(target, dtype))
    out_groups = math.ceil(cols / target.amp_out_chans)
    passes = math.ceil(target.amp_out_chans / target.conv_units)
    loads = _weight_loads(half, target)
    zeroing = inner_loop_cycles(rows, True, half, target)
    plain = inner_loop_cycles(rows, False, half, target)
    retention = target.threads_per_tile * (7 + 3 * (in_groups * groups - 1)) if half else 0
    first = 10 + 1 + out_groups * (19 - 1 + passes * (7 + loads + zeroing))
    others = (in_groups - 1) * (15 - 1 + 1 + out_groups * (19 + passes * (6 + loads + plain)))
    return 50 + retention + groups * (12 + 1 + others + first)


def _weight_loads(half: bool, target: Target) -> int:
    """Cycles to load one pass's weights into the conv units' coefficient registers."""
    chans = target.amp_in_chans_half if half else target.amp_in_chans_float
    weight_bytes = chans * (2 if half else 4)
    return target.conv_units * weight_bytes // target.coeff_load_bytes_per_cycle


def reduce_plan(depth: int) -> tuple[int, ...]:
    """The depths of the intermediate partials when `depth` partials are reduced in stages
    (PopLibs' `getMultiStageReducePlan`): one stage below 16 partials, two below 125, else
    three, each stage's depth near the stage-th root of the total so that tiles receive few
    messages."""
    stages = 1 if depth < 16 else 2 if depth < 125 else 3
    return _stage_plan(depth, stages)[0]


def _stage_plan(depth: int, stages: int) -> tuple[tuple[int, ...], float]:
    if stages == 1:
        return (), float(depth)
    down = int(depth ** ((stages - 1) / stages))
    options = []
    for nxt in (down, down + 1):
        plan, cost = _stage_plan(nxt, stages - 1)
        options.append(((nxt, *plan), cost + depth / nxt))
    return options[0] if options[0][1] < options[1][1] else options[1]


def reduce_stages(depth: int) -> list[int]:
    """How many partials each stage of a reduction of `depth` partials adds, in the stages of
    `reduce_plan`: each intermediate stage adds ceil(remaining / next depth), the last what is
    left (PopLibs' `estimateConvReduceCycles` and `ConvReduce.cpp` walk the plan so)."""
    stages: list[int] = []
    for remaining in (*reduce_plan(depth), 1):
        if depth <= 1:
            break
        stages.append(-(-depth // remaining) if remaining > 1 else depth)
        depth = -(-depth // stages[-1])
    return stages


def _reduce_vertex(
    outputs: int, partials: int, float_out: bool, float_partials: bool, single: bool, t: Target
) -> int:
    """One stage's `ReduceAdd` vertex (`getReduceCycleEstimate`): the single-input vertex reads
    its partials as one region, two cycles per accumulator vector and partial; the general one
    a cycle more per vector for the next pointer, and a tail loop for outputs that are not
    whole vectors."""
    workers = t.threads_per_tile
    acc = 4 if float_partials else 8
    if single:
        loops = math.ceil(outputs // acc / workers)
        overhead = (8 if float_out else 7) if float_partials else (10 if float_out else 9)
        return (20 + (2 * partials + overhead) * loops) * workers + 33
    loops = outputs // acc + bin(outputs & (acc - 1)).count("1")
    per_worker, cycles = loops // workers, 32
    if loops % workers:
        if outputs & (acc - 1):
            cycles += 2 * partials + (13 if float_partials else 11)
        else:
            per_worker += 1
    overhead = (7 if float_partials else 9) if float_out else (6 if float_partials else 8)
    return (cycles + (3 * partials + overhead) * per_worker) * workers


def partials_reduce_cycles(
    outputs: int,
    depth: int,
    target: Target,
    float_out: bool = True,
    float_partials: bool = True,
) -> int:
    """Reducing `depth` partials of `outputs` elements on a tile, as PopLibs'
    `estimateConvReduceCycles` charges it: in the stages of `reduce_stages`, each stage's last
    pass writing the result's type. A stage whose outputs are whole accumulator vectors (4
    floats or 8 halves) and whose partials take under 1/16 of the tile's memory runs the
    single-input vertex, which counts one partial fewer (the partials are added into the
    first); PopLibs rounds those bytes up to a memory element, which ipujax does not model
    (A)."""
    cycles, size = 0, outputs * depth
    itemsize = 4 if float_partials else 2
    stages = reduce_stages(depth)
    for i, this in enumerate(stages):
        size = math.ceil(size / this)
        last = i == len(stages) - 1
        single = size % (4 if float_partials else 8) == 0 and (
            (this - 1) * size * itemsize < target.bytes_per_tile // 16
        )
        out = float_out if last else float_partials
        cycles += _reduce_vertex(size, this - single, out, float_partials, single, target)
    return cycles

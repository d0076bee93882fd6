"""Cost rules: FLOPs, transcendental evaluations and bytes moved by each op.

These are counts, not cycles: the ipujax cost model turns them into cycles with the Target's
rates. Conventions, the ones XLA's HloCostAnalysis uses:
- an elementwise op is one FLOP per result element (a transcendental also counts once as a
  transcendental, because the IPU evaluates those at a lower rate);
- a contraction is 2 FLOPs (multiply and add) per multiply-accumulate;
- a reduction is one FLOP per input element and operand; a window reduction one per window
  element and output element; a sort `n * ceil(log2 n)` comparisons per sorted row of length n;
- bytes are every operand read once plus every result written once;
- data movement (reshape, slice, gather, ...) is bytes only. Control flow (while, case) counts
  nothing itself: its regions are costed where they run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lowering.ir import Op, Value
from lowering.library_ops import LIBRARY_FLOPS
from lowering.vocabulary import (
    DATA_MOVEMENT,
    ELEMENTWISE,
    FUSIONS,
    SOURCES,
    TRANSCENDENTAL,
)


@dataclass(frozen=True, slots=True)
class OpCost:
    flops: int = 0
    transcendentals: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written


Values = tuple[Value, ...]
CostRule = Callable[..., OpCost]


def _traffic(operands: Values, results: Values, flops: int = 0, transcendentals: int = 0) -> OpCost:
    return OpCost(
        flops=flops,
        transcendentals=transcendentals,
        bytes_read=sum(v.nbytes for v in operands),
        bytes_written=sum(v.nbytes for v in results),
    )


def _elementwise_cost_rule(operands: Values, results: Values, **attrs: Any) -> OpCost:
    return _traffic(operands, results, flops=results[0].size)


def _transcendental_cost_rule(operands: Values, results: Values, **attrs: Any) -> OpCost:
    n = results[0].size
    return _traffic(operands, results, flops=n, transcendentals=n)


def _movement_cost_rule(operands: Values, results: Values, **attrs: Any) -> OpCost:
    return _traffic(operands, results)


def _nothing_cost_rule(operands: Values, results: Values, **attrs: Any) -> OpCost:
    return OpCost()


def _dot_general_cost_rule(
    operands: Values, results: Values, *, dimension_numbers: Any, **attrs: Any
) -> OpCost:
    (lhs_contracting, _), _ = dimension_numbers
    depth = math.prod(operands[0].shape[d] for d in lhs_contracting)
    return _traffic(operands, results, flops=2 * results[0].size * depth)


def _convolution_cost_rule(
    operands: Values, results: Values, *, dimension_numbers: Any, **attrs: Any
) -> OpCost:
    _, (_, in_feature, *spatial), _ = dimension_numbers
    kernel = operands[1].shape
    depth = kernel[in_feature] * math.prod(kernel[d] for d in spatial)
    return _traffic(operands, results, flops=2 * results[0].size * depth)


def _reduce_cost_rule(operands: Values, results: Values, **attrs: Any) -> OpCost:
    half = len(operands) // 2
    return _traffic(operands, results, flops=sum(v.size for v in operands[:half]))


def _reduce_window_cost_rule(
    operands: Values, results: Values, *, window_dimensions: tuple[int, ...], **attrs: Any
) -> OpCost:
    flops = sum(r.size for r in results) * math.prod(window_dimensions)
    return _traffic(operands, results, flops=flops)


def _sort_cost_rule(operands: Values, results: Values, *, dimension: int, **attrs: Any) -> OpCost:
    length = operands[0].shape[dimension]
    comparisons = operands[0].size * max(1, math.ceil(math.log2(max(length, 1))))
    return _traffic(operands, results, flops=comparisons)


def _top_k_cost_rule(operands: Values, results: Values, *, k: int, **attrs: Any) -> OpCost:
    comparisons = operands[0].size * max(1, math.ceil(math.log2(max(k, 1))))
    return _traffic(operands, results, flops=comparisons)


def _scatter_cost_rule(operands: Values, results: Values, *, combiner: str, **attrs: Any) -> OpCost:
    updates = operands[2].size
    return _traffic(operands, results, flops=0 if combiner == "set" else updates)


def _select_and_scatter_cost_rule(
    operands: Values, results: Values, *, window_dimensions: tuple[int, ...], **attrs: Any
) -> OpCost:
    # One comparison per window element to select, one add per source element to scatter.
    source = operands[1].size
    return _traffic(operands, results, flops=source * (math.prod(window_dimensions) + 1))


def _summing_collective_cost_rule(operands: Values, results: Values, **attrs: Any) -> OpCost:
    # The adds a reducing collective does on each IPU; its link traffic is the partitioner's.
    return _traffic(operands, results, flops=sum(x.size for x in operands))


def _library_cost_rule(name: str) -> CostRule:
    """An op of `library_ops`: its FLOPs by its family's count, its operands and results."""

    def rule(operands: Values, results: Values, **attrs: Any) -> OpCost:
        return _traffic(operands, results, flops=LIBRARY_FLOPS[name](operands, results, **attrs))

    rule.__name__ = f"_{name}_cost_rule"
    return rule


COST_RULES: dict[str, CostRule] = {
    **{name: _library_cost_rule(name) for name in LIBRARY_FLOPS},
    "all_reduce": _summing_collective_cost_rule,
    "reduce_scatter": _summing_collective_cost_rule,
    "all_gather": _movement_cost_rule,
    "all_to_all": _movement_cost_rule,
    "shard_slice": _movement_cost_rule,
    "shard_mask": _elementwise_cost_rule,
    "shard_index": _elementwise_cost_rule,
    "halo_exchange": _movement_cost_rule,  # its link traffic is the partitioner's
    **{name: _elementwise_cost_rule for name in ELEMENTWISE},
    **{name: _transcendental_cost_rule for name in TRANSCENDENTAL},
    **{name: _movement_cost_rule for name in DATA_MOVEMENT | SOURCES},
    "convert": _movement_cost_rule,
    "bitcast_convert": _movement_cost_rule,
    "dot_general": _dot_general_cost_rule,
    "convolution": _convolution_cost_rule,
    "reduce": _reduce_cost_rule,
    "reduce_window": _reduce_window_cost_rule,
    "scatter": _scatter_cost_rule,
    "select_and_scatter": _select_and_scatter_cost_rule,
    "sort": _sort_cost_rule,
    "top_k": _top_k_cost_rule,
    "while": _nothing_cost_rule,
    "case": _nothing_cost_rule,
    "fusion": _nothing_cost_rule,  # its members' costs: `op_cost`
    "optimization_barrier": _nothing_cost_rule,
    "sharding_constraint": _nothing_cost_rule,
    "manual_computation": _nothing_cost_rule,  # its body's ops run on each IPU
    "collective_permute": _movement_cost_rule,  # its link traffic is the partitioner's
    "partition_id": _nothing_cost_rule,
}


def op_cost(op: Op) -> OpCost:
    """The FLOPs and bytes of one op (not of the ops nested in its regions, but a fusion's
    members, which are its work)."""
    if op.name in FUSIONS:
        return _fusion_cost(op)
    return COST_RULES[op.name](op.operands, op.results, **op.attrs)


def _fusion_cost(op: Op) -> OpCost:
    """A fusion's members' FLOPs, and the bytes of its own operands and results: what it reads
    and writes (its members' intermediates stay in registers)."""
    parts = [op_cost(member) for member in op.regions[0].ops]
    traffic = _traffic(op.operands, op.results)
    return dataclasses.replace(
        traffic,
        flops=sum(p.flops for p in parts),
        transcendentals=sum(p.transcendentals for p in parts),
    )

"""An op's parts in per-IPU form, for `partition`: the attributes that spell out shapes
rewritten for the per-IPU shapes, and regions that read outer values (StableHLO's implicit
capture) made to read their per-IPU versions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lowering import Graph, Op, Value, free_values
from partitioner.sharding.conv_factors import local_group_counts


def localized_attrs(
    op: Op, local_results: Sequence[tuple[int, ...]], operands: Sequence[Value]
) -> dict[str, Any]:
    """Attributes that spell out shapes, rewritten for per-IPU shapes."""
    attrs = dict(op.attrs)
    if op.name in ("broadcast_in_dim", "iota"):
        attrs["shape"] = tuple(local_results[0])
    elif op.name == "reshape":
        attrs["new_sizes"] = tuple(local_results[0])
    elif op.name == "slice":
        global_in = op.operands[0].shape
        attrs["limit_indices"] = tuple(
            operands[0].shape[d] if lim == n else lim
            for d, (lim, n) in enumerate(zip(attrs["limit_indices"], global_in, strict=True))
        )
    elif op.name in ("dynamic_slice", "gather"):
        global_in = op.operands[0].shape
        attrs["slice_sizes"] = tuple(
            operands[0].shape[d] if s == n else s
            for d, (s, n) in enumerate(zip(attrs["slice_sizes"], global_in, strict=True))
        )
    elif op.name == "convolution":
        attrs.update(local_group_counts(op, operands[0]))
    return attrs


def free_values_of(op: Op) -> tuple[Value, ...]:
    """The outer values `op`'s regions read, in order, each once."""
    found: dict[Value, None] = {}
    for region in op.regions:
        for value in free_values(region):
            found[value] = None
    return tuple(found)


def substitute(graph: Graph, mapping: Mapping[Value, Value]) -> Graph:
    """The graph with captured outer values replaced by their per-IPU versions."""
    ops = tuple(
        Op(
            op.name,
            tuple(mapping.get(v, v) for v in op.operands),
            op.results,
            op.attrs,
            tuple(substitute(r, mapping) for r in op.regions),
            op.loc,
        )
        for op in graph.ops
    )
    outputs = tuple(mapping.get(v, v) for v in graph.outputs)
    return Graph(graph.inputs, outputs, ops, name=graph.name)

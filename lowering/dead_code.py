"""Dead-code elimination: ops whose results nothing reads.

jax's StableHLO can hold such ops (the zeros of a `jnp.where` transpose that another path
replaced, for instance), which XLA drops when it compiles. The simulator drops them too, or a
dead broadcast of a whole attention matrix would be laid out, costed and counted in memory.
An op is dead when none of its results is read by a live op, a region, or the graph's outputs,
unless it has side effects (a host callback: `vocabulary.SIDE_EFFECTS`).
"""

from __future__ import annotations

import dataclasses

from lowering.ir import Graph, Value, free_values
from lowering.vocabulary import SIDE_EFFECTS


def eliminate_dead_code(graph: Graph) -> Graph:
    """The graph without its dead top-level ops."""
    live: set[Value] = set(graph.outputs)
    kept = []
    for op in reversed(graph.ops):
        if op.name not in SIDE_EFFECTS and not any(v in live for v in op.results):
            continue
        kept.append(op)
        live.update(op.operands)
        for region in op.regions:
            live.update(free_values(region))
    if len(kept) == len(graph.ops):
        return graph
    return dataclasses.replace(graph, ops=tuple(reversed(kept)))

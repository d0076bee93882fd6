"""Which tasks run once per micro-batch and which once per step.

A task is per micro-batch when the micro-batch dimension of the batch arguments reaches it.
That is sharding propagation with a mesh axis of its own for the micro-batches (`MICROBATCH`):
gradients summed over the batch are pending sums over that axis, so the optimizer that reads
them runs once per step, exactly as gradient accumulation makes it.
"""

from __future__ import annotations

from collections.abc import Sequence

from lowering import Graph, Value, op_reads
from partitioner.sharding.propagation import propagate_shardings
from partitioner.sharding.specs import Sharding

MICROBATCH = "microbatch"  # the pseudo mesh axis micro-batches are told apart by


def per_microbatch(graph: Graph, batch_inputs: Sequence[int]) -> list[bool]:
    """For each op of `graph`, whether it runs once per micro-batch: the batch arguments'
    leading dimension, split over `MICROBATCH`, reaches its factors, or it reads a value that
    varies by micro-batch. A result summed over that axis (a weight's gradient, the mean loss)
    is a sum over micro-batches, accumulated: what reads it runs once per step."""
    given = {}
    for index in batch_inputs:
        value = graph.inputs[index]
        if value.shape:
            given[value] = Sharding(((MICROBATCH,),) + ((),) * (len(value.shape) - 1))
    propagated = propagate_shardings(graph, given, {})
    varying: set[Value] = set(given)
    out = []
    for op in graph.ops:
        axes = propagated.op_factors[op]
        reduction = propagated.factors[op].reduction
        reached = any(MICROBATCH in a for a in axes)
        summed = any(MICROBATCH in axes[f] for f in reduction)
        each = reached or any(v in varying for v in op_reads(op))
        if each and not summed:
            varying.update(op.results)
        out.append(each)
    return out

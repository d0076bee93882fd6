"""Which tasks run once per micro-batch and which once per step.

A task is per micro-batch when the micro-batch dimension of the batch arguments reaches it.
That is sharding propagation with a mesh axis of its own for the micro-batches (`MICROBATCH`):
gradients summed over the batch are pending sums over that axis, so the optimizer that reads
them runs once per step, exactly as gradient accumulation makes it. Propagation sees a fused
chain (`lowering.fusion`) as its members, so that a fusion ending in a sum over the batch (a
bias's gradient) is a sum over micro-batches too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from lowering import FUSION, Graph, Op, Value, members, op_reads
from partitioner.sharding.propagation import propagate_shardings
from partitioner.sharding.specs import Sharding

MICROBATCH = "microbatch"  # the pseudo mesh axis micro-batches are told apart by


def per_microbatch(graph: Graph, batch_inputs: Sequence[int]) -> list[bool]:
    """For each op of `graph`, whether it runs once per micro-batch: the batch arguments'
    leading dimension, split over `MICROBATCH`, reaches its factors, or it reads a value that
    varies by micro-batch; a fusion when any of its members does. A result summed over that
    axis (a weight's gradient, the mean loss) is a sum over micro-batches, accumulated: what
    reads it runs once per step."""
    flat, owner = _unfused(graph)
    each = _per_op(flat, batch_inputs)
    out = [False] * len(graph.ops)
    for index, flag in zip(owner, each, strict=True):
        out[index] |= flag
    return out


def _per_op(graph: Graph, batch_inputs: Sequence[int]) -> list[bool]:
    """`per_microbatch` for a graph without fusions."""
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


def _unfused(graph: Graph) -> tuple[Graph, list[int]]:
    """`graph` with each fusion replaced by its members on the fusion's own operands and
    result (propagation has no factor rule for a fusion: it is made after partitioning), and
    for each op of it the index of the op of `graph` it came from."""
    ops: list[Op] = []
    owner: list[int] = []
    for index, op in enumerate(graph.ops):
        inlined = _inlined(op) if op.name == FUSION else (op,)
        ops += inlined
        owner += [index] * len(inlined)
    if len(ops) == len(graph.ops):
        return graph, owner
    return dataclasses.replace(graph, ops=tuple(ops)), owner


def _inlined(fusion: Op) -> tuple[Op, ...]:
    """A fusion's members reading its operands where they read its region's inputs, the root
    making the fusion's result."""
    (region,) = fusion.regions
    renamed = dict(zip(region.inputs, fusion.operands, strict=True))
    renamed.update(zip(region.outputs, fusion.results, strict=True))
    return tuple(
        dataclasses.replace(
            op,
            operands=tuple(renamed.get(v, v) for v in op.operands),
            results=tuple(renamed.get(v, v) for v in op.results),
        )
        for op in members(fusion)
    )

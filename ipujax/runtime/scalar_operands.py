"""Scalars broadcast for an elementwise op, handed to it as scalars.

StableHLO spells `x * 2` as a multiply by a broadcast constant, and the per-IPU program keeps
the broadcast (on an IPU it is a view of the scalar, `tile_rules.views`). jax.lax's binary ops
take a rank-0 operand as it is, so the runtime passes them the scalar: one equation fewer for
jax to trace and lower, and under the runtime's vmap one fewer again, since vmap broadcasts an
unbatched operand of full rank where it meets a batched one, but leaves a scalar alone. The
4-IPU GPT step has 789 such broadcasts, read by 732 of its 1,681 elementwise ops. Only the
runtime's program changes; a broadcast something else still reads stays.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from lowering import BINARY, Value
from partitioner import Program, Task

# The ops whose jax.lax evaluation takes a scalar for any operand (tested op by op).
SCALAR_OPERAND_OPS = BINARY | {"compare"}


def pass_scalars(program: Program) -> Program:
    """`program` with each scalar broadcast read by a `SCALAR_OPERAND_OPS` op read as the
    scalar, and broadcasts nothing reads any more dropped; the same program when none is."""
    producers = {v: t for t in program.tasks for v in t.op.results}
    replaced: dict[Task, Task] = {}
    for task in program.tasks:
        if task.op.name in SCALAR_OPERAND_OPS:
            scalars = _scalar_inputs(task, producers)
            if scalars != task.inputs:
                replaced[task] = dataclasses.replace(task, inputs=scalars)
    if not replaced:
        return program
    tasks = [replaced.get(t, t) for t in program.tasks]
    read = Counter(v for t in tasks for v in t.inputs)
    read.update(program.outputs)
    kept = tuple(t for t in tasks if t.op.name != "broadcast_in_dim" or read[t.op.results[0]])
    return dataclasses.replace(program, tasks=kept)


def _scalar_inputs(task: Task, producers: dict[Value, Task]) -> tuple[Value, ...]:
    """The task's inputs with each broadcast of a scalar replaced by the scalar, as long as
    some operand keeps the result's shape."""
    sources = []
    for value in task.inputs:
        producer = producers.get(value)
        if producer is not None and producer.op.name == "broadcast_in_dim":
            (source,) = producer.op.operands
            value = source if source.shape == () else value
        sources.append(value)
    shape = task.op.results[0].shape
    if not any(s is v and v.shape == shape for s, v in zip(sources, task.inputs, strict=True)):
        return task.inputs  # every operand a scalar: the result would be one
    return tuple(sources)

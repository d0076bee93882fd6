"""Scalars broadcast for an elementwise op, handed to it as scalars.

StableHLO spells `x * 2` as a multiply by a broadcast constant, and the per-IPU program keeps
the broadcast (on an IPU it is a view of the scalar, `tile_rules.views`). jax.lax's binary ops
take a rank-0 operand as it is, so the runtime passes them the scalar: one equation fewer for
jax to trace and lower, and under the runtime's vmap one fewer again, since vmap broadcasts an
unbatched operand of full rank where it meets a batched one, but leaves a scalar alone. The
4-IPU GPT step has 789 such broadcasts, read by 732 of its 1,681 elementwise ops. Only the
runtime's program changes; a broadcast something else still reads stays. A fusion's members
take the scalar the same way (`fusion_eval_rule` runs them on whatever its inputs are).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from lowering import BINARY, FUSIONS, Op, Value
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
        elif task.op.name in FUSIONS:
            scalars = _fusion_scalar_inputs(task, producers)
        else:
            continue
        if scalars != task.inputs:
            replaced[task] = dataclasses.replace(task, inputs=scalars)
    if not replaced:
        return program
    tasks = [replaced.get(t, t) for t in program.tasks]
    read = Counter(v for t in tasks for v in t.inputs)
    read.update(program.outputs)
    kept = tuple(t for t in tasks if t.op.name != "broadcast_in_dim" or read[t.op.results[0]])
    return dataclasses.replace(program, tasks=kept)


def _scalar_of(value: Value, producers: dict[Value, Task]) -> Value | None:
    """The scalar a value broadcasts, if it is a broadcast of one."""
    producer = producers.get(value)
    if producer is None or producer.op.name != "broadcast_in_dim":
        return None
    (source,) = producer.op.operands
    return source if source.shape == () else None


def _fusion_scalar_inputs(task: Task, producers: dict[Value, Task]) -> tuple[Value, ...]:
    """A fusion's inputs with each broadcast of a scalar replaced by the scalar when every
    member that reads it is a `SCALAR_OPERAND_OPS` op with another operand of its result's
    shape (so no member's result shrinks to a scalar)."""
    region = task.op.regions[0]
    inputs = list(task.inputs)
    passed: set[Value] = set()
    for i, value in enumerate(task.inputs):
        scalar = _scalar_of(value, producers)
        inner = region.inputs[i]
        readers = [m for m in region.ops if inner in m.operands]
        if scalar is not None and readers and all(_keeps_shape(m, inner, passed) for m in readers):
            inputs[i] = scalar
            passed.add(inner)
    return tuple(inputs)


def _keeps_shape(member: Op, scalar: Value, passed: set[Value]) -> bool:
    shape = member.results[0].shape
    others = [v for v in member.operands if v is not scalar and v not in passed]
    return member.name in SCALAR_OPERAND_OPS and any(v.shape == shape for v in others)


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

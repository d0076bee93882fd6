"""Counting the trips of the loops whose trips only a run knows (`partitioner.open_loops`), so
that the cost report can charge what the program did.

Each such loop's task runs its `while` with an int32 counter carried beside its state (the
evaluator's `count_trips`), and returns the count as one more result, which the program hands
out after its own outputs; the `Runner` strips them and keeps the last run's. The values are
`jax.jit`'s: the counter never reaches the condition or the body. Only the loops named are
counted, so a program without one runs exactly as before. Under `vmap` over mesh axes each IPU
counts its own loop's trips; the runner keeps the most (BSP waits for the slowest IPU).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Collection

import numpy as np

from lowering import Op, Value, apply_rule, walk
from partitioner import Program, Task

COUNTER = np.dtype(np.int32)


def with_counters(program: Program, loops: Collection[Value]) -> tuple[Program, tuple[Value, ...]]:
    """`program` with each loop of `loops` (named by its first result) also returning its trips,
    appended to the outputs; and the loops counted, in the order of their counts."""
    ids = itertools.count(1 + _largest_id(program))
    tasks: list[Task] = []
    counters: list[Value] = []
    counted: list[Value] = []
    for task in program.tasks:
        if task.op.name == "while" and task.op.results[0] in loops:
            count = Value(next(ids), (), COUNTER)
            counted.append(task.op.results[0])
            counters.append(count)
            task = _counting(task, count)
        tasks.append(task)
    if not counters:
        return program, ()
    outputs = (*program.outputs, *counters)
    return dataclasses.replace(program, tasks=tuple(tasks), outputs=outputs), tuple(counted)


def _counting(task: Task, count: Value) -> Task:
    """The loop's task, its op with one more result (the trips) and a kernel that counts."""
    op, inputs = task.op, task.inputs
    operands = len(op.operands)
    captured = inputs[operands:]
    attrs = {**op.attrs, "count_trips": True}

    def kernel(*arrays: np.ndarray) -> tuple:
        env = dict(zip(captured, arrays[operands:], strict=True))
        return tuple(apply_rule(op, list(arrays[:operands]), attrs, env))

    counted = dataclasses.replace(op, results=(*op.results, count))
    return dataclasses.replace(task, op=counted, kernel=kernel)


def _largest_id(program: Program) -> int:
    """The largest value id the program uses, in its regions too, so a counter's is new."""
    values = [*program.inputs]
    for task in program.tasks:
        values += _defined(task.op)
        values += [v for r in task.op.regions for o in walk(r) for v in _defined(o)]
    return max((v.id for v in values), default=0)


def _defined(op: Op) -> tuple[Value, ...]:
    return (*op.results, *(v for r in op.regions for v in r.inputs))

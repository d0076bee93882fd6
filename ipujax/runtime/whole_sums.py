"""Sums in XLA's order under `numerics="exact"`: each reduction runs as the op itself.

A reduction's kernel from the partitioner adds in the order its split over tiles does (each
tile's run of the reduced elements, then the runs' partials: `tiles.rules.reduce`), which is
the IPU's rounding. `numerics="exact"` promises jax.jit's numbers instead, and jax.jit adds in
XLA's order: so there the runtime runs every reduction, and every fused chain that ends in one,
as the op itself on the whole tensor (`whole_kernel`). That is also what XLA:CPU runs fastest:
a staged sum pads and reshapes its operand into runs first. Only how the simulator computes
changes; the cost report still charges each tile's stages. Under `numerics="ipu"` the staged
sums stay, with the stochastic rounding.
"""

from __future__ import annotations

import dataclasses

from lowering import Op, members
from partitioner import Program, Task, whole_kernel


def whole_sums(program: Program) -> Program:
    """`program` with its reductions' kernels the ops themselves (loops and branches run their
    regions through the evaluator already, which reduces in one go)."""
    tasks = tuple(_whole(task) if _sums(task.op) else task for task in program.tasks)
    return dataclasses.replace(program, tasks=tasks)


def _sums(op: Op) -> bool:
    return any(m.name == "reduce" for m in members(op))


def _whole(task: Task) -> Task:
    return dataclasses.replace(task, kernel=whole_kernel(task.op, task.inputs))

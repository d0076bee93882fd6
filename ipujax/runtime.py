"""The BSP runtime: runs a scheduled Program on `[tiles, *block]` arrays.

The whole program is one jitted jax function, so a call costs about one XLA call: inputs are
laid out on tiles, each task's kernel runs its supersteps (exchanges are static re-layouts, compute
sets are vmapped per-tile kernels), and the outputs are gathered back. Step-by-step mode runs one
task at a time, each jitted on its own, and reports every task's results, for traces and
debugging. 64-bit types are on inside, because jax's own lowerings use u64 (see lowering).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax

from lowering import Value
from partitioner.layout import from_tiles, to_tiles
from partitioner.program import Program, Task

Array = Any


def _run_tasks(program: Program, flat: Sequence[Array]) -> tuple[Array, ...]:
    env: dict[Value, Array] = {
        v: to_tiles(x, lay)
        for v, x, lay in zip(program.inputs, flat, program.input_layouts, strict=True)
    }
    for task in program.tasks:
        results = task.kernel(*[env[v] for v in task.inputs])
        env.update(zip(task.op.results, results, strict=True))
    return tuple(from_tiles(env[v], program.layouts[v]) for v in program.outputs)


def compile_program(program: Program, donate: Sequence[int] = ()) -> Callable[..., tuple]:
    """The program as one jitted function of its flat inputs."""
    jitted = jax.jit(lambda *flat: _run_tasks(program, flat), donate_argnums=tuple(donate))

    def run(*flat: Array) -> tuple[Array, ...]:
        with jax.enable_x64(True):
            return jitted(*flat)

    return run


def run_step_by_step(program: Program, flat: Sequence[Array]) -> Iterator[tuple[Task, tuple]]:
    """Runs one task at a time; yields each task and its results as logical arrays."""
    with jax.enable_x64(True):
        env: dict[Value, Array] = {
            v: to_tiles(x, lay)
            for v, x, lay in zip(program.inputs, flat, program.input_layouts, strict=True)
        }
        for task in program.tasks:
            results = jax.jit(task.kernel)(*[env[v] for v in task.inputs])
            env.update(zip(task.op.results, results, strict=True))
            logical = tuple(
                from_tiles(r, lay) for r, lay in zip(results, task.result_layouts, strict=True)
            )
            yield task, logical

"""The BSP runtime: runs a scheduled Program on `[tiles, *block]` arrays.

The whole program is one jitted jax function, so a call costs about one XLA call: inputs are
laid out on tiles, each task's kernel runs its supersteps (exchanges are static re-layouts, compute
sets are vmapped per-tile kernels), and the outputs are gathered back. Step-by-step mode runs one
task at a time, each jitted on its own, and reports every task's results, for traces and
debugging. 64-bit types are on inside, because jax's own lowerings use u64 (see lowering).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from lowering import Value
from partitioner.layout import from_tiles, to_tiles
from partitioner.partition import Partitioned
from partitioner.program import Program, Task
from partitioner.sharding import Sharding

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


# ---- many IPUs: the per-IPU program vmapped over the mesh axes -------------------------------


def _split_input(x: Array, sharding: Sharding, axis_names: Sequence[str], sizes: dict) -> Array:
    """A global array as `[mesh axes it is split over..., *block]`, padded to divide."""
    parts: list[int] = []
    positions: dict[str, int] = {}
    pads = []
    for dim, axes in enumerate(sharding.dims):
        groups = math.prod(sizes[a] for a in axes)
        local = -(-x.shape[dim] // groups)
        pads.append((0, local * groups - x.shape[dim]))
        for a in axes:
            positions[a] = len(parts)
            parts.append(sizes[a])
        parts.append(local)
    if any(high for _, high in pads):
        x = jnp.pad(x, pads)
    x = jnp.reshape(x, parts)
    leading = [positions[a] for a in axis_names if a in positions]
    rest = [i for i in range(len(parts)) if i not in leading]
    return jnp.transpose(x, leading + rest)


def _join_output(
    x: Array, sharding: Sharding, shape: tuple[int, ...], axis_names: Sequence[str]
) -> Array:
    """The global array from `[every mesh axis..., *block]` outputs."""
    used = {a for d in sharding.dims for a in d}
    index = tuple(slice(None) if a in used else 0 for a in axis_names)
    x = x[index]
    kept = [a for a in axis_names if a in used]
    order: list[int] = []
    for dim, axes in enumerate(sharding.dims):
        order += [kept.index(a) for a in axes]
        order.append(len(kept) + dim)
    x = jnp.transpose(x, order)
    merged = [
        math.prod(x.shape[i] for i in range(len(order)) if order[i] in group)
        for group in _groups(sharding, kept)
    ]
    x = jnp.reshape(x, merged)
    return x[tuple(slice(0, n) for n in shape)]


def _groups(sharding: Sharding, kept: list[str]) -> list[set[int]]:
    return [
        {kept.index(a) for a in axes} | {len(kept) + dim} for dim, axes in enumerate(sharding.dims)
    ]


def compile_partitioned(
    program: Program,
    partitioned: Partitioned,
    axis_names: Sequence[str],
    sizes: dict,
    donate: Sequence[int] = (),
) -> Callable[..., tuple]:
    """The per-IPU program run on every IPU of the mesh at once, as one jitted function: one
    `jax.vmap` per mesh axis, named so that collectives are `jax.lax` collectives over it."""
    in_shardings = partitioned.input_shardings
    out_shardings = partitioned.output_shardings
    global_outputs = partitioned.global_graph.outputs

    def per_ipu(*flat: Array) -> tuple[Array, ...]:
        return _run_tasks(program, flat)

    run = per_ipu
    for axis in reversed(axis_names):
        in_axes = tuple(0 if axis in s.axes else None for s in in_shardings)
        run = jax.vmap(run, in_axes=in_axes, axis_name=axis, axis_size=sizes[axis])

    def everything(*flat: Array) -> tuple[Array, ...]:
        shards = [
            _split_input(x, s, axis_names, sizes) for x, s in zip(flat, in_shardings, strict=True)
        ]
        outputs = run(*shards)
        return tuple(
            _join_output(y, s, v.shape, axis_names)
            for y, s, v in zip(outputs, out_shardings, global_outputs, strict=True)
        )

    jitted = jax.jit(everything, donate_argnums=tuple(donate))

    def call(*flat: Array) -> tuple[Array, ...]:
        with jax.enable_x64(True):
            return jitted(*flat)

    return call

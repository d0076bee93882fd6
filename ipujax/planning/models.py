"""What the plan search costs: a `Model` makes `(fun, args, jit_kwargs)` for a mesh (and a depth,
when the workload takes `layers`), from a user's step and sharding rule (`data_parallel` when
there is none) or from a workload factory (`workload_model`, the CLI's)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec

from ipujax.errors import ConfigError
from ipujax.planning.candidates import PIPELINE_AXIS, REPLICAS
from partitioner import Mesh

Made = tuple[Callable[..., Any], tuple, dict[str, Any]]  # (fun, args, jit_kwargs)
Maker = Callable[[Mesh, "int | None"], Made]


@dataclass(frozen=True)
class Model:
    """What the search costs: `make(mesh, layers)` returns `(fun, args, jit_kwargs)` for a mesh,
    at `layers` depth (None: the full depth). `depth` is the full depth when the model can be
    built shallower, else None. `batch_argnums` are the arguments that carry the batch.
    `choose_microbatches`: a pipelined mesh tries several micro-batch counts (a fixed global
    batch); else the workload's pipeline keeps its own. `remake` makes the same model again in
    another process (a module-level function and plain values, so it pickles: a worker of the
    search calls it); None keeps the search in one process."""

    make: Maker
    depth: int | None = None
    batch_argnums: tuple[int, ...] | None = None
    choose_microbatches: bool = False
    remake: Callable[[], Model] | None = field(default=None, compare=False, repr=False)


def samples_per_step(
    args: tuple, jit_kwargs: dict[str, Any], batch_argnums: Sequence[int] | None = None
) -> int:
    """The samples a step trains on: the leading dimension of the first leaf of the batch
    argument (`batch_argnums`, else the pipeline's, else the last positional argument)."""
    pipeline = jit_kwargs.get("pipeline")
    positions = batch_argnums or (pipeline and pipeline.batch_argnums) or (-1,)
    leaves = jax.tree.leaves(args[positions[0]]) if args else []
    shape = np.shape(leaves[0]) if leaves else ()
    return int(shape[0]) if shape else 1


def data_parallel(mesh: Mesh, args: tuple, batch_argnums: Sequence[int]) -> tuple:
    """The default rule: the batch arguments split over `dp` along their leading dimension,
    every other argument whole on every IPU (a pipeline's stages are its named scopes, so `pp`
    needs no spec); a mesh with tensor-parallel axes is not expressible."""
    others = sorted(set(mesh.axis_names) - {REPLICAS, PIPELINE_AXIS})
    if others:
        raise ConfigError(
            f"the default rule is data parallel only and cannot use mesh axes {others}; pass "
            "rule=lambda mesh: in_shardings to ipujax.plan for tensor parallelism"
        )
    positions = {i % len(args) for i in batch_argnums}

    def spec(i: int, arg: Any) -> Any:
        if i not in positions or mesh.shape.get(REPLICAS, 1) == 1:
            return jax.tree.map(lambda _: PartitionSpec(), arg)
        return jax.tree.map(lambda _: PartitionSpec(REPLICAS), arg)

    return tuple(spec(i, a) for i, a in enumerate(args))


def step_model(
    fun: Callable[..., Any],
    args: tuple,
    rule: Callable[[Mesh], Any] | None,
    batch_argnums: Sequence[int],
) -> Model:
    """A model of the user's step `fun(*args)`: each mesh's `in_shardings` from `rule(mesh)`
    (else `data_parallel`), the batch `args`' own, micro-batch counts the search's to choose."""

    def make(mesh: Mesh, layers: int | None) -> Made:
        in_shardings = rule(mesh) if rule is not None else data_parallel(mesh, args, batch_argnums)
        return fun, args, {"in_shardings": in_shardings}

    return Model(make, batch_argnums=tuple(batch_argnums), choose_microbatches=True)


def workload_model(
    factory: Callable[..., Any],
    call: Callable[..., tuple],
    remake: Callable[[], Model] | None = None,
) -> Model:
    """A model from a workload factory (the CLI's `path.py:NAME`), called through `call(mesh,
    **extra)`: each mesh gets the factory's own shardings, batch and pipeline; a factory with a
    `layers` keyword whose default is an integer is costed shallow and extrapolated. `remake`:
    `Model.remake`."""
    depth = _depth(factory)

    def make(mesh: Mesh, layers: int | None) -> Made:
        extra = {} if layers is None else {"layers": layers}
        return call(mesh, **extra)

    return Model(make, depth=depth, remake=remake)


def _depth(factory: Callable[..., Any]) -> int | None:
    try:
        parameter = inspect.signature(factory).parameters.get("layers")
    except (TypeError, ValueError):
        return None
    if parameter is None or not isinstance(parameter.default, int):
        return None
    return int(parameter.default)

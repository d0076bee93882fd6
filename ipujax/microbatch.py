"""A pipelined step's micro-batch: the program the partitioner costs for a `Pipeline`, traced
with the batch arguments' leading dimension divided by the micro-batches, and the flat inputs
that carry the batch.
"""

from __future__ import annotations

import warnings
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh

from ipujax.arguments import Call, leaf_ranges
from ipujax.errors import BatchArgumentWarning
from ipujax.host_bound import user_stacklevel
from ipujax.tracing import traced
from lowering import Graph
from partitioner import ConfigError, Pipeline


def micro_batch(
    call: Call, pipeline: Pipeline, traced_under: AbstractMesh
) -> tuple[Graph, tuple[int, ...]]:
    """One micro-batch's program and the flat inputs that carry the batch."""
    ranges = leaf_ranges(call)
    wanted = _batch_positions(pipeline, ranges, call.count)
    batch = [i for p, flat in ranges if p in wanted for i in flat]
    if not batch:
        raise ConfigError(
            f"Pipeline(batch_argnums={pipeline.batch_argnums}) names no argument of the "
            f"{call.count} given; say which positional arguments carry the batch"
        )
    if pipeline.batch_argnums is None:
        _warn_other_batches(call, ranges, wanted)
    micro_args = [
        jax.tree.map(lambda x, p=p: _split_batch(x, pipeline.microbatches, p), arg)
        if p in wanted
        else arg
        for (p, _), arg in zip(ranges, call.args, strict=True)
    ]
    return traced(call.fun, micro_args, call.kwargs, traced_under), tuple(batch)


def _batch_positions(
    pipeline: Pipeline, ranges: list[tuple[int, range]], count: int
) -> tuple[int, ...]:
    """The positions of the arguments that carry the batch: the pipeline's `batch_argnums`,
    else the last dynamic argument."""
    wanted = pipeline.batch_argnums
    if wanted is None:
        wanted = (ranges[-1][0],) if ranges else ()
    return tuple(i % count for i in wanted if -count <= i < count)


def _warn_other_batches(call: Call, ranges: list[tuple[int, range]], wanted: tuple) -> None:
    """A warning when the batch is the default (the last argument) and another argument's
    leaves all lead with the batch's rows: a step(params, x, y) whose x is cut into
    micro-batches too, which the default would leave whole (costing a pipeline of the wrong
    micro-batch where the shapes broadcast)."""
    by_position = dict(zip((p for p, _ in ranges), call.args, strict=True))
    shapes = [np.shape(leaf) for p in wanted for leaf in jax.tree.leaves(by_position[p])]
    rows = {shape[0] if shape else 0 for shape in shapes}  # a scalar has no batch rows
    if len(rows) != 1 or min(rows, default=0) < 2:
        return
    (batch,) = rows
    alike = [
        p
        for p, arg in by_position.items()
        if p not in wanted
        and (leaves := jax.tree.leaves(arg))
        and all(np.ndim(leaf) and np.shape(leaf)[0] == batch for leaf in leaves)
    ]
    if alike:
        warnings.warn(
            f"Pipeline cuts only argument {wanted[0]} (its default batch_argnums, the last "
            f"argument) into micro-batches, but argument{'s' if len(alike) > 1 else ''} "
            f"{', '.join(map(str, alike))} also lead{'' if len(alike) > 1 else 's'} with its "
            f"{batch} rows: if they carry the batch too, give "
            f"Pipeline(batch_argnums={tuple(sorted((*alike, *wanted)))})",
            BatchArgumentWarning,
            stacklevel=user_stacklevel(),
        )


def _split_batch(leaf: Any, microbatches: int, position: int) -> jax.ShapeDtypeStruct:
    """A batch leaf's micro-batch: its leading dimension divided by the micro-batches."""
    shape = tuple(np.shape(leaf))
    if not shape or shape[0] % microbatches:
        rows = shape[0] if shape else "no"
        raise ConfigError(
            f"Pipeline(microbatches={microbatches}): argument {position} has {rows} rows in its "
            f"leading (batch) dimension, shape {shape}, which do not split into "
            f"{microbatches} micro-batches; give a batch that is a multiple of {microbatches}"
        )
    dtype = getattr(leaf, "dtype", None) or np.asarray(leaf).dtype
    return jax.ShapeDtypeStruct((shape[0] // microbatches, *shape[1:]), dtype)

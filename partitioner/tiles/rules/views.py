"""Ops that cost nothing: reshapes, broadcasts, annotations and barriers; and constants, mapped
linearly."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from lowering import Op, Value, apply_rule
from partitioner.layout import Layout
from partitioner.program import Task
from partitioner.tiles.context import MappingContext


def reshape_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    source = layouts[0]
    # A reshape keeps the row-major order, and a layout's view is a row-major reshape of its
    # tensor: the result is the same elements on the same tiles, a view in Poplar as here.
    shape = op.results[0].shape
    out = dataclasses.replace(source, shape=shape)
    return Task(op, inputs, layouts, (out,), lambda x: (x.reshape(shape),), aliases=(0,))


def broadcast_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    """A broadcast is a view of its source in Poplar: no storage of its own and no work; a tile
    that reads it receives at most the source (`common.received_bytes`)."""
    out = ctx.linear(op.results[0])

    def kernel(x: Any) -> tuple[Any, ...]:
        return tuple(apply_rule(op, [x], op.attrs, {}))

    return Task(op, inputs, layouts, (out,), kernel, aliases=(0,))


def identity_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    count = len(op.operands)
    return Task(
        op,
        inputs,
        layouts,
        layouts[:count],
        lambda *tiles: tiles[:count],
        aliases=tuple(range(count)),
    )


def constant_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    value = op.attrs["value"]
    out = ctx.linear(op.results[0])
    ctx.constants[op.results[0]] = value
    # The numpy value itself: jax folds a concrete scalar where it can (a sum from a zero
    # start is `reduce_sum`, no traced computation); under jit, jnp.asarray would be a tracer.
    return Task(op, inputs, layouts, (out,), lambda: (np.asarray(value),))

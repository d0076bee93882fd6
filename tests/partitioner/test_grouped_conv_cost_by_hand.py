"""Grouped and depthwise convolutions costed by hand: PopLibs plans conv groups as a partition
dimension, so each tile holds whole groups with their inputs, weights and outputs; the exchange
brings a tile its groups' input window (halo included) and its groups' weights, and the result
stays where it was made, laid out by group (docs/target.md, "Convolutions on the AMP")."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import ipujax
from lowering import lower
from partitioner.cost.amp import amp_cycles
from partitioner.cost.vector import cast_cycles
from partitioner.tiles.matmul_plan import _plan, tile_cycles
from partitioner.tiles.rules.conv import conv_problem

TILES = 16
TARGET = ipujax.Target.bow().with_tiles(TILES)
HALF = np.dtype(np.float16)


def _grouped(x, w, groups: int):
    return lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=groups,
    )  # fmt: skip


def _compiled(x, w, groups: int, target: ipujax.Target = TARGET) -> ipujax.Compiled:
    mesh = ipujax.make_mesh((1,), ("ipu",), target=target)
    fun = lambda x, w: _grouped(x, w, groups)  # noqa: E731
    return ipujax.jit(fun, mesh=mesh).lower(x, w).compile()


def _conv_steps(compiled: ipujax.Compiled) -> dict[str, ipujax.SuperstepCost]:
    return {s.name: s for s in compiled.cost_report().supersteps if s.op == "convolution"}


def _exchange(received: int) -> int:
    """docs/target.md, "Exchange and sync": the busiest tile's bytes at 4 B a cycle, plus the
    fixed overhead."""
    return math.ceil(received / TARGET.exchange_bytes_per_cycle) + TARGET.exchange_overhead_cycles


def test_a_group_width_16_convolution_puts_one_group_on_each_tile() -> None:
    # 2 images of 8x8, 64 channels in 4 groups of 16 (EfficientNet-G16's grouped convolution).
    x = jax.ShapeDtypeStruct((2, 8, 8, 64), jnp.float16)
    w = jax.ShapeDtypeStruct((3, 3, 16, 64), jnp.float16)
    (op,) = [
        op for op in lower(lambda x, w: _grouped(x, w, 4), x, w).ops if op.name == "convolution"
    ]
    p = conv_problem(op)
    # Per group: rows 2 x 8 x 8 outputs, 16 columns, depth 16 channels x 9 positions.
    assert (p.batch, p.rows, p.cols, p.depth) == (4, 128, 16, 144)
    plan = _plan(p, TARGET)
    # Groups over 4 tiles, each group's outputs over 4: 32 outputs (4 rows of 8) a tile.
    assert (plan.b, plan.m, plan.n, plan.k, plan.serial) == (4, 4, 1, 1, 1)
    compiled = _compiled(x, w, 4)
    steps = _conv_steps(compiled)
    assert set(steps) == {"convolution.matmul", "convolution.cast"}  # no relayout, no reduce
    # A tile's input: its group's 16 channels, rows (4 - 1) + (3 - 1) + 1 = 6 of 8, columns
    # 7 + 2 + 1 = 10 capped at 8 (the padding is not exchanged); its group's weights 9 x 16 x 16.
    received = 16 * 6 * 8 * 2 + 9 * 16 * 16 * 2
    assert received == 6_144
    matmul = steps["convolution.matmul"]
    assert matmul.busiest_tile_bytes == received
    assert matmul.exchange_bytes == received * TILES
    assert matmul.exchange_cycles == _exchange(received) == 1_636
    # The AMP over a [32, 144] x [144, 16] block of one group (docs/target.md, "Compute"), the
    # float partials cast to halves.
    assert matmul.compute_cycles == amp_cycles(32, 144, 16, 1, HALF, TARGET)
    cast = cast_cycles(32 * 16, np.dtype(np.float32), HALF, TARGET)
    assert steps["convolution.cast"].compute_cycles == cast
    # The result stays where it was made: each tile a run of 32 rows of its group's 16 channels.
    (task,) = [t for t in compiled.built.program.tasks if t.op.name == "convolution"]
    (layout,) = task.result_layouts
    assert (layout.view, layout.grid, layout.block) == ((128, 4, 16), (4, 4, 1), (32, 1, 16))


def test_a_depthwise_convolution_brings_each_tile_its_groups_and_their_halos() -> None:
    # 32 channels, one a group: the input window and weights of each group, nothing else.
    x = jax.ShapeDtypeStruct((2, 8, 8, 32), jnp.float16)
    w = jax.ShapeDtypeStruct((3, 3, 1, 32), jnp.float16)
    (op,) = [
        op for op in lower(lambda x, w: _grouped(x, w, 32), x, w).ops if op.name == "convolution"
    ]
    p = conv_problem(op)
    assert (p.batch, p.rows, p.cols, p.depth) == (32, 128, 1, 9)
    plan = _plan(p, TARGET)
    assert (plan.m, plan.n, plan.k) == (1, 1, 1)  # a group's outputs on one tile
    groups = -(-32 // plan.b)
    compiled = _compiled(x, w, 32)
    matmul = _conv_steps(compiled)["convolution.matmul"]
    # Each of its groups' whole input (2 images of 8 x 8, a channel: the field and its halo)
    # and 9 weights.
    received = groups * (2 * 8 * 8 * 2 + 9 * 2)
    assert matmul.busiest_tile_bytes == received
    assert matmul.exchange_bytes == received * plan.tiles
    assert matmul.exchange_cycles == _exchange(received)
    cycles = tile_cycles(p, (plan.b, plan.m, plan.n, plan.k), plan.serial, TARGET)
    assert matmul.compute_cycles == cycles.amp + cycles.accumulate
    (task,) = [t for t in compiled.built.program.tasks if t.op.name == "convolution"]
    (layout,) = task.result_layouts
    assert (layout.view, layout.grid) == ((128, 32, 1), (1, plan.b, 1))
    assert layout.block == (128, groups, 1)


def _68_groups(batch: int) -> tuple[ipujax.Compiled, ipujax.Compiled]:
    """EfficientNet-B-sized: 1,088 channels in 68 groups of 16, a 5x5 window on a 12x12 map,
    forward and weight gradient, on a whole Bow IPU."""
    x = jax.ShapeDtypeStruct((batch, 12, 12, 1088), jnp.float16)
    w = jax.ShapeDtypeStruct((5, 5, 16, 1088), jnp.float16)
    dy = jax.ShapeDtypeStruct((batch, 12, 12, 1088), jnp.float16)
    mesh = ipujax.make_mesh((1,), ("ipu",), target=ipujax.Target.bow())

    def weight_gradient(x, w, dy):
        return jax.vjp(lambda w: _grouped(x, w, 68), w)[1](dy)[0]

    forward = ipujax.jit(lambda x, w, dy: _grouped(x, w, 68), mesh=mesh, resident_argnums=(0, 1, 2))
    backward = ipujax.jit(weight_gradient, mesh=mesh, resident_argnums=(0, 1, 2))
    return forward.lower(x, w, dy).compile(), backward.lower(x, w, dy).compile()


def _device(compiled: ipujax.Compiled) -> tuple[int, int]:
    steps = [s for s in compiled.cost_report().supersteps if s.kind != "host"]
    return sum(s.exchange_bytes for s in steps), sum(s.cycles for s in steps)


def test_68_groups_move_megabytes_not_hundreds_and_the_weight_gradient_costs_its_forward() -> None:
    for batch in (3, 16):
        (fwd_bytes, fwd_cycles), (wu_bytes, wu_cycles) = map(_device, _68_groups(batch))
        operands = 2 * batch * 12 * 12 * 1088 * 2 + 5 * 5 * 16 * 1088 * 2
        # Each tile receives its groups' windows and weights (a group's weights go to every
        # tile of its outputs) and its share of the partials: a few times the operands, where
        # the linear layout moved 639 MB.
        assert fwd_bytes < 25 * operands and wu_bytes < 25 * operands
        assert wu_cycles < 1.5 * fwd_cycles and fwd_cycles < 1.5 * wu_cycles

"""Sibling reductions (`lowering.siblings`, `tiles.rules.siblings`): reductions of one tensor over
the same dimensions run together, as PopLibs runs a batch norm's mean and mean of squares
(lib/poplin/Norms.cpp: one list of compute sets for both) and popops' `reduceMany` any set of
reductions; the values are jax.jit's, and the joint task's supersteps are derived here from the
reductions planned alone.

By hand: the k-th superstep of the joint task runs the k-th stage of every reduction. Its compute
cycles are the sum of theirs (one vertex per reduction on each tile, the tiles the same), its
busiest tile receives the sum of their bytes, and the exchange costs those bytes at the exchange
rate plus the fixed overhead once; the sync is paid once. Casts read twice are copied into each
reader's chain (`lowering.cast_copies`), and reductions over dimensions of one element are
reshapes (`lowering.unit_reductions`), as XLA makes them.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import compile_for, target
from hypothesis import given, settings
from hypothesis import strategies as st

import lowering
from lowering import fuse_elementwise, interpret, lower
from partitioner.tiles.rules import siblings as siblings_rule

X = np.random.default_rng(0).normal(size=(8, 14, 14, 64)).astype(np.float16)
AXES = (0, 1, 2)
TARGET = target(16)  # compile_for's
TILES = 1472  # a whole Bow IPU

pytestmark = pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")


def _mean(x):
    return jnp.mean(x, axis=AXES, dtype=jnp.float32)


def _power(x):
    return jnp.mean(jnp.square(x.astype(jnp.float32)), axis=AXES)


def _statistics(x):
    """A batch norm's statistics in one pass, as flax and PopLibs compute them."""
    mean, power = _mean(x), _power(x)
    return mean, jnp.maximum(power - mean * mean, 0.0)


def _reducing(compiled) -> list:
    return [
        t for t in compiled.program.tasks if any(m.name == "reduce" for m in lowering.members(t.op))
    ]


@pytest.mark.parametrize("tiles", [TILES, 16])
def test_a_mean_and_a_mean_of_squares_run_as_one_task_at_the_hand_derived_cycles(tiles) -> None:
    """On a whole Bow IPU each reduction is planned where x lies, then one combining stage;
    on 16 tiles, x is moved into a grid of whole rows and reduced in one stage. Either way the
    joint task's stages are the reductions' stages together, x moved once."""
    joint = compile_for(_statistics, X, tiles=tiles)
    (task,) = _reducing(joint)
    assert len(task.op.results) == 2
    (mean,) = _reducing(compile_for(_mean, X, tiles=tiles))
    (power,) = _reducing(compile_for(_power, X, tiles=tiles))
    assert len(task.supersteps) == len(mean.supersteps) == len(power.supersteps)
    assert len(task.supersteps) == (2 if tiles == TILES else 1)
    target = TARGET.with_tiles(tiles)
    for k, (step, a, b) in enumerate(
        zip(task.supersteps, mean.supersteps, power.supersteps, strict=True)
    ):
        assert step.compute_cycles == a.compute_cycles + b.compute_cycles
        assert step.flops == a.flops + b.flops
        received = a.busiest_tile_bytes + b.busiest_tile_bytes
        if k == 0:  # x (and what the chains read) once
            received = max(a.busiest_tile_bytes, b.busiest_tile_bytes)
        assert step.busiest_tile_bytes == received
        moved = math.ceil(received / target.exchange_bytes_per_cycle)
        assert step.exchange_cycles == (moved + target.exchange_overhead_cycles if received else 0)
        assert step.sync_cycles == a.sync_cycles  # once, not twice
    saved = sum(s.cycles for s in (*mean.supersteps, *power.supersteps)) - sum(
        s.cycles for s in task.supersteps
    )
    # at least a sync a stage: the two reductions apart pay one each
    assert saved >= len(task.supersteps) * mean.supersteps[0].sync_cycles
    for ours, want in zip(joint(X), jax.jit(_statistics)(X), strict=True):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(want))


def test_a_reduction_of_anothers_result_is_not_its_sibling() -> None:
    """The two-pass variance reads the mean: it waits for it, as Poplar's stable algorithm
    does (a superstep set of its own)."""

    def two_pass(x):
        mean = _mean(x)
        return mean, jnp.mean(jnp.square(x.astype(jnp.float32) - mean), axis=AXES)

    compiled = compile_for(two_pass, X)
    assert [len(t.op.results) for t in _reducing(compiled)] == [1, 1]
    for ours, want in zip(compiled(X), jax.jit(two_pass)(X), strict=True):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(want))


def test_reductions_of_different_tensors_stay_apart() -> None:
    def two(x, y):
        return x.sum(axis=AXES), y.sum(axis=AXES)

    compiled = compile_for(two, X, X + 1)
    assert [len(t.op.results) for t in _reducing(compiled)] == [1, 1]


def test_a_cast_written_between_siblings_waits_behind_them() -> None:
    """A normalisation's parameter gradients, the sums of dy and of dy * x: jax writes the
    first sum's cast before the second sum; the cast waits and the sums run together (PopLibs'
    `normParamGradients` reduces the two as one tensor)."""

    def gradients(dy, x):
        beta = dy.sum(axis=AXES, dtype=jnp.float32).astype(jnp.float16)
        gamma = (dy * x).sum(axis=AXES, dtype=jnp.float32).astype(jnp.float16)
        return beta, gamma

    compiled = compile_for(gradients, X, X)
    (task,) = _reducing(compiled)
    assert len(task.op.results) == 2
    for ours, want in zip(compiled(X, X), jax.jit(gradients)(X, X), strict=True):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(want))


def test_a_cast_read_twice_is_copied_into_each_chain() -> None:
    """x cast to float, read by a sum of squares and by an elementwise chain: no superstep of
    its own, no float copy of x stored; each chain casts as it reads."""

    def twice(x):
        wide = x.astype(jnp.float32)
        return jnp.sum(wide * wide, axis=AXES), jnp.tanh(wide) * 2.0

    compiled = compile_for(twice, X)
    assert "convert" not in [t.op.name for t in compiled.program.tasks]
    casts = [m for t in compiled.program.tasks for m in lowering.members(t.op)]
    assert sum(m.name == "convert" for m in casts) == 2
    for ours, want in zip(compiled(X), jax.jit(twice)(X), strict=True):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(want), rtol=1e-6)


def test_a_sum_over_dimensions_of_one_is_a_reshape_with_jax_jits_bits() -> None:
    """XLA's simplifier makes the sum a reshape: -0.0 stays -0.0 (0.0 + -0.0 would be 0.0)."""

    def one(x):
        return x[None].sum(axis=0) * 2.0

    x = np.array([-0.0, 1.5, -2.0], np.float32)
    compiled = compile_for(one, x)
    assert not _reducing(compiled)
    assert [t.op.name for t in compiled.program.tasks if t.supersteps] == ["multiply"]
    ours, want = np.asarray(compiled(x)), np.asarray(jax.jit(one)(x))
    np.testing.assert_array_equal(ours, want)
    assert np.signbit(ours[0]) == np.signbit(want[0])


@st.composite
def _programs(draw):
    """Two to four sums or maxima of x (some through a cast, squared or scaled), over one set
    of dimensions, some of them reading an earlier one's result."""
    count = draw(st.integers(2, 4))
    axes = draw(st.sampled_from([(0,), (1,), (0, 1)]))
    return axes, [
        (draw(st.sampled_from(["sum", "max"])), draw(st.sampled_from(["x", "cast", "square"])),
         draw(st.booleans()))
        for _ in range(count)
    ]  # fmt: skip


def _run(program, x):
    axes, steps = program
    out = []
    for kind, prologue, after in steps:
        y = {"x": x, "cast": x.astype(jnp.float32), "square": x * x}[prologue]
        if after and out:  # read an earlier result: not a sibling of it
            y = y + jnp.expand_dims(out[-1], axes)
        out.append(y.sum(axis=axes) if kind == "sum" else y.max(axis=axes))
    return tuple(out)


@settings(max_examples=25, deadline=None)
@given(_programs())
def test_joining_siblings_never_changes_a_value(program) -> None:
    x = np.random.default_rng(1).normal(size=(6, 5, 3)).astype(np.float32)
    graph = lower(lambda x: _run(program, x), x)
    fused = fuse_elementwise(graph)
    for ours, want in zip(interpret(fused, [x]), interpret(graph, [x]), strict=True):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(want))
    # each joint fusion's reductions are independent: none reads what another one makes
    for op in fused.ops:
        if len(op.results) > 1:
            parts = siblings_rule.reductions(op)
            made = {v for part in parts for m in lowering.members(part) for v in m.results}
            assert not any(v in made for part in parts for v in part.operands)

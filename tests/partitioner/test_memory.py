"""Tile memory: checked per tile at compile time, before anything runs, as Poplar checks it."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import BOW_BYTES_PER_TILE, compile_for, mesh, spec, target

import ipujax
from partitioner.tiles.matmul_plan import plan_matmul

HERE = os.path.basename(__file__)

# 4 Mi f32 = 16 MiB, more than all 16 tiles hold together (16 x 638,976 B = 10.2 MB).
HUGE = spec((4 * 1024 * 1024,))


def _double(weights: jax.Array) -> jax.Array:
    return weights + weights  # one add, no constants


# Code and state on every tile of a program of one elementwise f32 step that moves nothing
# (docs/target.md, "Tile memory and mapping"): vertex code 396 (the elementwise framework) + 232
# (the op's codelet); vertex state 32 (fixed) + 16 (the vertex); no exchange code; control
# code 24 for the one step; stack 40 + 6 x 32. 628 + 48 + 0 + 24 + 232 = 932.
ONE_STEP_CODE = 396 + 232 + 32 + 16 + 24 + 40 + 6 * 32

# By hand, for _double on HUGE over 16 tiles: the linear layout puts 4,194,304 / 16 = 262,144
# elements (1,048,576 B) on every tile; the add follows it, so its result has the same block.
# Per tile: always-live input 1,048,576 + the add's result 1,048,576 (live during the one task)
# + code and state 932 = 2,098,084.
HUGE_TILE_BYTES = 2 * 1_048_576 + ONE_STEP_CODE


def test_input_larger_than_the_ipu_is_out_of_memory() -> None:
    lowered = ipujax.jit(_double, mesh=mesh(16)).lower(HUGE)
    with pytest.raises(ipujax.OutOfMemoryError) as info:
        lowered.compile()
    message = str(info.value)
    assert "IPU 0" in message
    assert "tile 0" in message  # every tile is as full; the first is reported
    assert f"{HUGE_TILE_BYTES:,}" in message  # needed: 2,098,084
    assert "638,976" in message  # available
    assert "16 of 16 tiles" in message
    assert "weights" in message  # the argument, by its parameter name
    assert "float32[4194304]" in message
    assert HERE in message  # the add's source line
    assert "phases" in message  # among the remedies
    assert isinstance(info.value, ipujax.IpujaxError)


def test_calling_an_oversized_program_is_out_of_memory() -> None:
    # Calling the jitted function compiles first, and compiling checks memory before running.
    jitted = ipujax.jit(_double, mesh=mesh(16))
    with pytest.raises(ipujax.OutOfMemoryError, match="weights"):
        jitted(np.zeros(HUGE.shape, np.float32))
    assert len(jitted._cache) == 0  # nothing that does not fit is cached


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")  # about memory, not the host
def test_unchecked_compile_reports_the_overflow() -> None:
    report = compile_for(_double, HUGE, check_memory_fits=False).cost_report()
    assert report.fits is False
    assert report.peak_tile_bytes > BOW_BYTES_PER_TILE
    assert report.peak_tile_bytes == HUGE_TILE_BYTES
    assert report.tile_memory.shape == (1, 16)
    np.testing.assert_array_equal(report.tile_memory, np.full((1, 16), HUGE_TILE_BYTES))
    np.testing.assert_array_equal(report.always_live, np.full((1, 16), 1_048_576))
    assert "NO" in report.summary()


def test_tile_memory_shape_follows_the_target() -> None:
    x = spec((64,))
    small = compile_for(lambda a: a * a, x, tiles=16).cost_report()
    full = compile_for(lambda a: a * a, x, tiles=1472).cost_report()
    assert small.tile_memory.shape == (1, 16)
    assert small.always_live.shape == (1, 16)
    assert full.tile_memory.shape == (1, 1472)
    assert full.always_live.shape == (1, 1472)
    assert small.tile_memory.dtype == np.int64


def test_tiny_program_fits_and_memory_by_hand() -> None:
    # x + y, f32[4096] each, on 16 tiles: x and y both on tiles 0..15, 256 elements (1,024 B)
    # each per tile, always live; the add's result 1,024 B per tile; code and state 932 for one
    # step. 2,048 + 1,024 + 932 = 4,004 B on every tile.
    compiled = compile_for(lambda x, y: x + y, spec((4096,)), spec((4096,)))
    report = compiled.cost_report()
    assert report.fits is True
    assert report.peak_tile_bytes == 2_048 + 1_024 + ONE_STEP_CODE == 4_004
    np.testing.assert_array_equal(report.tile_memory, np.full((1, 16), 4_004))
    np.testing.assert_array_equal(report.always_live, np.full((1, 16), 2_048))
    assert "fits: yes" in report.summary()


def test_always_live_holds_the_inputs() -> None:
    # An input of N bytes on a linear layout puts at least N / (tiles it uses) on each of them.
    # f32[4096] on a full Bow: at least 32 elements per tile, tiles used min(1472, 4096 // 32)
    # = 128, 32 elements = 128 B each on tiles 0..127; the second input starts at tile 128.
    x = spec((4096,))
    compiled = compile_for(lambda a, b: a - b, x, x, tiles=1472)
    always = compiled.cost_report().always_live[0]
    n = 4096 * 4
    assert always.sum() >= 2 * n
    assert np.all(always[:256] >= n // 128)
    np.testing.assert_array_equal(always[:256], np.full(256, 128))
    assert np.all(always[256:] == 0)
    layouts = compiled.program.input_layouts
    assert [(lay.start, lay.tiles) for lay in layouts] == [(0, 128), (128, 128)]
    # Total memory includes the always-live bytes and, on every tile, the fixed vertex state
    # (32), the subtraction's control code (24) and the stack (232).
    total = compiled.cost_report().tile_memory[0]
    assert np.all(total >= always + 32 + 24 + 232)


def test_intermediates_are_not_always_live() -> None:
    # A chain of elementwise ops: the intermediates are freed after their last reader, so the
    # peak is below the sum of every value's bytes; only the input is always live.
    def chain(x: jax.Array) -> jax.Array:
        for _ in range(6):
            x = jnp.sin(x)
        return x

    compiled = compile_for(chain, spec((4096,)), fuse=False)  # fused, there is no intermediate
    report = compiled.cost_report()
    per_value = 1024  # 256 f32 per tile
    np.testing.assert_array_equal(report.always_live, np.full((1, 16), per_value))
    memory = compiled.memory
    # At each sin, its operand and its result are live: 2 blocks, never 6.
    np.testing.assert_array_equal(memory.not_always_live, np.full(16, 2 * per_value))
    # The six sin steps are identical, so they share one step's code and state: 932.
    np.testing.assert_array_equal(memory.code, np.full(16, ONE_STEP_CODE))


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")  # about memory, not the host
def test_serial_matmul_plan_that_fits_its_budget_compiles() -> None:
    # [384, 1024] x [1024, 384] f32 on 16 tiles. The planner picks a 2 x 8 output grid with K in
    # 4 serial chunks (192 rows a tile keep the AMP's passes long; 48 columns are 3 groups of
    # 16): blocks [192, 1024] and [1024, 48], 983,040 B in all per tile, of which a chunk of
    # 245,760 B is held at a time, plus 192 x 48 x 4 = 36,864 B of partial sums: 282,624 B of
    # temporaries, within 0.6 x 638,976 = 383,385.
    plan = plan_matmul(1, 384, 384, 1024, np.dtype(np.float32), 4, target(16))
    assert (plan.m, plan.n, plan.k, plan.serial) == (2, 8, 1, 4)
    assert plan.temp_bytes_per_tile == 282_624
    # Per tile then: inputs 2 x 384 x 1024 x 4 / 16 = 196,608 always live; the temporaries
    # 282,624; the result 36,864; code and state under 4 KiB (the AMP vertex 588 + 664, its
    # state 32 + 64, control code 24, stack 232, one exchange's code 32 + 48 per tile heard
    # from). At most 470,992 B < 638,976 B.
    report = compile_for(lambda a, b: a @ b, spec((384, 1024)), spec((1024, 384))).cost_report()
    assert report.fits
    assert report.peak_tile_bytes <= 196_608 + 282_624 + 36_864 + 4_096

"""The compile's shortcuts give what the long way gives (issue 39: GPT-3 costed in seconds):
scope blocks found and split in one pass, tile memory from storages the caller already has, the
storages with activations kept on chip or values held as shards from those without, the
sweep's peak tasks against a task-by-task count, sweeps in 32 bits against 64, and records
shared by repeated layers read once each."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import ipujax
from partitioner.memory.liveness import storages, value_uses, with_kept, with_ways
from partitioner.memory.tiles import _live_by_task, _Sweep, tile_memory
from partitioner.phases.scopes import scope_blocks, split_by_names, split_by_scope_blocks
from partitioner.phases.split import split_auto
from partitioner.program import per_record


def _blocks(x, w):
    for i in range(3):
        with jax.named_scope(f"block{i}"):
            x = jnp.tanh(x @ w)
    with jax.named_scope("head"):
        return x.sum()


def _compiled(fun, phases):
    x = jax.ShapeDtypeStruct((8, 64), jnp.float32)
    w = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    mesh = ipujax.make_mesh((1,), ("ipu",), target=ipujax.Target.bow().with_tiles(16))
    return ipujax.jit(jax.grad(fun), mesh=mesh, phases=phases).lower(x, w).compile()


def test_scope_blocks_split_in_one_pass_as_by_their_names() -> None:
    program = _compiled(_blocks, None).program
    names = scope_blocks(program)
    assert names == ["block0", "block1", "block2", "head"]
    once = split_by_scope_blocks(program)
    assert once is not None
    (fast, fast_plan), (slow, slow_plan) = once, split_by_names(program, names)
    assert fast.tasks == slow.tasks
    assert fast_plan.names == slow_plan.names
    assert fast_plan.bounds.bounds == slow_plan.bounds.bounds


def test_tile_memory_from_given_storages_is_the_same() -> None:
    compiled = _compiled(_blocks, None)
    program, plan = split_auto(compiled.program, compiled.built.target)
    target = compiled.built.target
    uses = value_uses(program, plan.bounds)
    stored = storages(program, plan.bounds, uses=uses)
    fresh = tile_memory(program, target, plan.bounds, uses=uses)
    given = tile_memory(program, target, plan.bounds, uses=uses, stored=stored)
    assert given.phase_peaks == fresh.phase_peaks
    for a, b in ((given.always_live, fresh.always_live), (given.peak_task, fresh.peak_task)):
        assert np.array_equal(a, b)
    assert np.array_equal(given.not_always_live, fresh.not_always_live)


def test_storages_with_activations_kept_from_those_without_are_the_same() -> None:
    compiled = _compiled(_blocks, None)
    program, plan = split_auto(compiled.program, compiled.built.target)
    uses = value_uses(program, plan.bounds)
    without = storages(program, plan.bounds, uses=uses)
    crossing = frozenset(s.value for s in without if len(s.spans) > 1)
    assert crossing  # activations read by a later phase: the case kept ones change
    for kept in (crossing, frozenset(list(crossing)[:1])):
        assert with_kept(without, kept, plan.bounds, uses) == storages(
            program, plan.bounds, kept, uses=uses
        )


def test_storages_with_values_held_as_shards_from_those_without_are_the_same() -> None:
    compiled = _compiled(_blocks, None)
    program, plan = split_auto(compiled.program, compiled.built.target)
    uses = value_uses(program, plan.bounds)
    without = storages(program, plan.bounds, uses=uses)
    values = [s.value for s in without]
    for ways in ({}, {values[0]: 4}, dict.fromkeys(values[::2], 2)):
        assert with_ways(without, ways) == storages(program, plan.bounds, ways=ways, uses=uses)


def test_peak_tasks_are_the_first_tasks_of_each_tiles_highest() -> None:
    """A task-by-task count of every storage's and temporary's bytes on each tile finds, per
    tile, the highest live bytes and the first task that holds them: the sweep's figures."""
    compiled = _compiled(_blocks, None)
    program, target = compiled.program, compiled.built.target
    memory = tile_memory(program, target)
    tiles, count = target.tiles_per_ipu, len(program.tasks)
    live = np.zeros((count, tiles), np.int64)
    for s in memory.storages:
        if not s.always_live:
            for a, b in s.spans:
                live[a : min(b, count - 1) + 1, s.layout.start : s.layout.stop] += s.bytes_per_tile
    for index, task in enumerate(program.tasks):
        for temp in task.temporaries:
            live[index, temp.start : temp.start + temp.tiles] += temp.bytes_per_tile
    assert np.array_equal(memory.not_always_live, live.max(axis=0))
    assert np.array_equal(memory.peak_task, live.argmax(axis=0))


def test_sweeps_in_32_bits_give_the_64_bit_figures(monkeypatch) -> None:
    """A small program's sums fit 32 bits, so its sweep narrows; forced to stay at 64 bits,
    every figure, per-phase peaks included, is the same."""
    compiled = _compiled(_blocks, "auto")
    program, plan, target = compiled.program, compiled.built.plan, compiled.built.target
    sweep = _live_by_task(program, storages(program, plan.bounds), target.tiles_per_ipu)
    sweep.narrow()
    assert sweep.dtype is np.int32
    narrow = tile_memory(program, target, plan.bounds)
    monkeypatch.setattr(_Sweep, "narrow", lambda self, headroom=0: None)
    wide = tile_memory(program, target, plan.bounds)
    assert narrow.phase_peaks == wide.phase_peaks and len(wide.phase_peaks) > 1
    assert np.array_equal(narrow.not_always_live, wide.not_always_live)
    assert np.array_equal(narrow.peak_task, wide.peak_task)


def test_a_sweep_whose_sums_could_overflow_32_bits_stays_at_64() -> None:
    compiled = _compiled(_blocks, None)
    program, target = compiled.program, compiled.built.target
    sweep = _live_by_task(program, storages(program), target.tiles_per_ipu)
    sweep.narrow(headroom=2**31)
    assert sweep.dtype is np.int64


def test_per_record_calls_once_per_distinct_record_in_order() -> None:
    calls = []

    def seen(record: list) -> int:
        calls.append(record)
        return len(record)

    a, b = [1], [2, 2]
    assert per_record([a, b, a, [1], b], seen) == [1, 2, 1, 1, 2]
    assert len(calls) == 3  # a, b and the equal but distinct [1]

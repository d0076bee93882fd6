"""Tile memory by PopVision category: a small program derived by hand from the Target's
constants (docs/target.md, "Tile memory and mapping"), and the invariants every program keeps:
no category is negative, they add up to the total, repeated steps share their code."""

from __future__ import annotations

import dataclasses

import numpy as np
from helpers import target
from hypothesis import given
from hypothesis import strategies as st

import ipujax
from lowering import Op, Value
from partitioner.layout import Layout
from partitioner.memory.code import CATEGORIES, OP_VERTEX_KINDS, code_memory
from partitioner.memory.tiles import tile_memory
from partitioner.program import Program, Superstep, Task

F32 = np.dtype(np.float32)


def _step(name: str, start: int, tiles: int, compute: int, received: int) -> Superstep:
    return Superstep(
        name=name,
        op=name.split(".")[0],
        source="",
        tiles=tiles,
        flops=0,
        exchange_bytes=received * tiles,
        compute_cycles=compute,
        exchange_cycles=100 if received else 0,
        sync_cycles=90,
        start=start,
        busiest_tile_bytes=received,
    )


def _task(name: str, inputs: tuple[Value, ...], result: Value, layouts: dict, *steps) -> Task:
    op = Op(name, inputs, (result,))
    ins = tuple(layouts[v] for v in inputs)
    return Task(op, inputs, ins, (layouts[result],), lambda *a: a[:1], tuple(steps))


def _program() -> Program:
    """On 8 tiles: y = x @ w, z = y + y, out = z + z.

    x f32[8, 32]: one row (128 B) on each of tiles 0-7; w f32[32, 16]: 8 rows (512 B) on each
    of tiles 4-7. The matmul runs on tiles 0-7 and receives 640 B on its busiest tile, then its
    partials are reduced onto tiles 0-1 (256 B received). y, z and out: 4 rows (256 B) on each
    of tiles 0-1. The two adds run the same step, so they share its code."""
    x, w = Value(0, (8, 32), F32), Value(1, (32, 16), F32)
    y, z, out = (Value(i, (8, 16), F32) for i in (2, 3, 4))
    on_two = Layout((8, 16), (8, 16), (2, 1), 0)
    layouts = {
        x: Layout((8, 32), (8, 32), (8, 1), 0),
        w: Layout((32, 16), (32, 16), (4, 1), 4),
        y: on_two,
        z: on_two,
        out: on_two,
    }
    matmul = _step("dot_general.matmul", 0, 8, 100, 640)
    partials = _step("dot_general.reduce_partials", 0, 2, 10, 256)
    add = _step("add", 0, 2, 5, 0)
    tasks = (
        _task("dot_general", (x, w), y, layouts, matmul, partials),
        _task("add", (y, y), z, layouts, add),
        _task("add", (z, z), out, layouts, add),
    )
    return Program((x, w), (layouts[x], layouts[w]), tasks, (out,), layouts, 8)


def _by_tile_groups(values: np.ndarray) -> tuple[int, int, int]:
    """(tiles 0-1, tiles 2-3, tiles 4-7), each group's tiles alike."""
    groups = (values[0:2], values[2:4], values[4:8])
    assert all(len(set(g.tolist())) == 1 for g in groups), values
    return tuple(int(g[0]) for g in groups)  # type: ignore[return-value]


def test_categories_by_hand() -> None:
    memory = tile_memory(_program(), target(8))
    got = {name: _by_tile_groups(v) for name, v in memory.categories().items()}
    # Variables: x (128 B) on tiles 0-7 and w (512 B) on tiles 4-7 are always live. z is
    # made in place over y (an add of a value nothing reads later); out is an output, so it has
    # storage of its own: at the last add, y's storage and out's, 2 x 256 B on tiles 0-1.
    assert got["variables_always_live"] == (128, 128, 128 + 512)
    assert got["variables_not_always_live"] == (512, 0, 0)
    # Vertex code: the matmul step runs the AMP vertex on tiles 0-7 (shared 588 + codelet 664
    # = 1,252); the partials' reduction a reduce vertex on tiles 0-1 (232); the adds one
    # elementwise codelet on tiles 0-1 (shared 396 + add 232 = 628).
    assert got["vertex_code"] == (1252 + 232 + 628, 1252, 1252)
    # Vertex state: 32 on every tile, then per step a tile computes in: AMP 64 (tiles 0-7),
    # reduce 12 and elementwise 16 (tiles 0-1; the second add shares the first's).
    assert got["vertex_state"] == (32 + 64 + 12 + 16, 32 + 64, 32 + 64)
    # Exchange code: 32 per exchange on each tile that sends or receives, and 24 per message at
    # each end:
    # - the matmul: x's tiles 0-7 and w's 4-7 send to tiles 0-7, all 32. Its inputs hold
    #   8 x 128 + 4 x 512 = 3,072 B on 12 tiles, 256 B a tile, so the 640 B a tile receives
    #   come in ceil(640 / 256) = 3 messages: 3 x 24 on tiles 0-7; the 8 x 3 messages are sent
    #   by the 8 tiles that hold inputs, 3 each: 3 x 24 more. 32 + 72 + 72 = 176 on tiles 0-7;
    # - the reduction: tiles 0-7 send their partials to tiles 0-1, all 32; each of tiles 0-1
    #   hears from 8 / 2 = 4 tiles (4 x 24 = 96), and each of tiles 0-7 sends 2 x 4 / 8 = 1
    #   message (24): 32 + 24 + 96 = 152 on tiles 0-1, 32 + 24 = 56 on tiles 2-7;
    # - the adds move nothing.
    assert got["exchange_code"] == (176 + 152, 176 + 56, 176 + 56)
    # Control code: three distinct steps (the two adds are one), 24 each, on every tile.
    assert got["control_code"] == (72, 72, 72)
    # Stack: the supervisor's 40 and six workers' 32 each.
    assert got["stack"] == (232, 232, 232)
    # 128 + 512 + 2,112 + 124 + 328 + 72 + 232 = 3,508; 128 + 1,252 + 96 + 232 + 72 + 232 =
    # 2,012; and with w's 512 more, 2,524.
    assert _by_tile_groups(memory.total) == (3508, 2012, 2524)


def test_the_fullest_tile_reports_its_categories() -> None:
    memory = tile_memory(_program(), target(8))
    assert memory.categories_of(0) == (
        ("variables_always_live", 128),
        ("variables_not_always_live", 512),
        ("vertex_code", 2112),
        ("vertex_state", 124),
        ("exchange_code", 328),
        ("control_code", 72),
        ("stack", 232),
    )
    assert tuple(name for name, _ in memory.categories_of(0)) == CATEGORIES


def test_every_op_runs_a_vertex_kind_the_targets_know() -> None:
    kinds = {k for k in OP_VERTEX_KINDS.values() if k is not None} | {"reduce", "copy"}
    for preset in (ipujax.Target.mk1(), ipujax.Target.mk2(), ipujax.Target.bow()):
        assert kinds <= {kind.name for kind in preset.vertex_kinds}


# ---- invariants ------------------------------------------------------------------------------

OPS = ("add", "multiply", "exponential", "dot_general", "reduce", "transpose", "all_reduce")


@st.composite
def programs(draw: st.DrawFn) -> tuple[Program, int]:
    """A chain of 1-6 tasks on up to 32 tiles, each of 0-2 supersteps anywhere on the chip, its
    value laid out linearly on a random run of tiles."""
    tiles = draw(st.integers(1, 32))

    def layout(value: Value) -> Layout:
        start = draw(st.integers(0, tiles - 1))
        used = draw(st.integers(1, tiles - start))
        return Layout(value.shape, value.shape, (used,), start, (-(-value.size // used),))

    def step(name: str) -> Superstep:
        start = draw(st.integers(0, tiles - 1))
        count = draw(st.integers(0, tiles - start))
        compute = draw(st.integers(0, 100))
        return _step(name, start, count, compute, draw(st.integers(0, 5000)))

    value = Value(0, (draw(st.integers(1, 4096)),), F32)
    layouts = {value: layout(value)}
    inputs = (value,)
    tasks = []
    for i in range(1, draw(st.integers(1, 6)) + 1):
        name = draw(st.sampled_from(OPS))
        result = Value(i, value.shape, F32)
        layouts[result] = layout(result)
        steps = [step(f"{name}.{k}") for k in range(draw(st.integers(0, 2)))]
        tasks.append(_task(name, (value,), result, layouts, *steps))
        value = result
    program = Program(inputs, (layouts[inputs[0]],), tuple(tasks), (value,), layouts, tiles)
    return program, tiles


@given(programs())
def test_categories_are_non_negative_and_add_up_to_the_total(case: tuple[Program, int]) -> None:
    program, tiles = case
    memory = tile_memory(program, target(tiles))
    categories = memory.categories()
    assert tuple(categories) == CATEGORIES
    for name, values in categories.items():
        assert values.shape == (tiles,), name
        assert (values >= 0).all(), name
    np.testing.assert_array_equal(sum(categories.values()), memory.total)
    for tile in range(tiles):
        assert sum(size for _, size in memory.categories_of(tile)) == memory.total[tile]


@given(programs())
def test_repeating_the_program_adds_no_code(case: tuple[Program, int]) -> None:
    """Every step of the second copy repeats one of the first: Poplar calls the same code."""
    program, tiles = case
    twice = dataclasses.replace(program, tasks=program.tasks + program.tasks)
    once, again = code_memory(program, target(tiles)), code_memory(twice, target(tiles))
    for name, values in once.by_category().items():
        np.testing.assert_array_equal(getattr(again, name), values)

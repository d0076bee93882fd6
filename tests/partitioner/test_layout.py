"""Property tests of tile layouts: `to_tiles`/`from_tiles` are exact inverses that put each block on
its tile, layouts the cost model calls the same place are, and `linear_layout` maps tensors as
Poplar's linear mapping does."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from partitioner.layout import Layout, from_tiles, linear_layout, tile_bytes, to_tiles

DTYPES = [np.float32, np.int32, np.float16, np.int8, np.uint8, np.bool_]


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    """A small shape, a view that holds it (itself, flat, or cut in two) and a grid on it."""
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=0, max_size=3)))
    size = math.prod(shape)
    kind = draw(st.sampled_from(["same", "flat", "two"]))
    if kind == "same" and shape:
        view = shape
    elif kind == "two" and size > 0:
        first = draw(st.sampled_from([d for d in range(1, size + 1) if size % d == 0]))
        view = (first, size // first)
    else:
        view = (size,)
    grid = tuple(draw(st.integers(1, max(1, v) + 2)) for v in view)
    start = draw(st.integers(0, 20))
    return Layout(shape, view, grid, start)


def _data(layout: Layout, dtype: type) -> np.ndarray:
    """Distinct values (modulo the dtype's range), so a misplaced element is seen."""
    values = np.arange(1, math.prod(layout.shape) + 1)
    if dtype is np.bool_:
        return (values % 2 == 0).reshape(layout.shape)
    if np.issubdtype(dtype, np.integer):
        values = values % np.iinfo(dtype).max
    return values.astype(dtype).reshape(layout.shape)


@given(layouts(), st.sampled_from(DTYPES))
def test_from_tiles_inverts_to_tiles(layout: Layout, dtype: type) -> None:
    x = _data(layout, dtype)
    tiles = to_tiles(x, layout)
    assert tiles.shape == (layout.tiles, *layout.block)
    back = np.asarray(from_tiles(tiles, layout))
    assert back.dtype == x.dtype
    assert back.shape == x.shape
    np.testing.assert_array_equal(back, x)


@given(layouts(), st.sampled_from([np.float32, np.int32]))
def test_each_tile_holds_its_block(layout: Layout, dtype: type) -> None:
    # Worked out with numpy slicing: block (i0, i1, ...) of the grid, in row-major order, is
    # view[i0*b0:(i0+1)*b0, ...], padded at the high end with the pad value.
    x = _data(layout, dtype)
    pad = -7
    tiles = np.asarray(to_tiles(x, layout, pad_value=pad))
    view = x.reshape(layout.view)
    for index, corner in enumerate(np.ndindex(*layout.grid)):
        block = np.full(layout.block, pad, dtype)
        region = tuple(
            slice(c * b, min((c + 1) * b, v))
            for c, b, v in zip(corner, layout.block, layout.view, strict=True)
        )
        part = view[region]
        block[tuple(slice(0, n) for n in part.shape)] = part
        np.testing.assert_array_equal(tiles[index], block)


@given(layouts())
def test_same_place_means_each_tile_holds_the_same_elements(layout: Layout) -> None:
    # The cost model charges nothing for a move between layouts in the same place; a layout
    # split only along its first view dimension is the same place as its flat runs.
    start, tiles, run = layout.storage()
    assume(start >= 0)
    flat = Layout(layout.shape, (math.prod(layout.view),), (tiles,), start, (run,))
    assert layout.same_place(flat)
    x = _data(layout, np.float32)
    mine = np.asarray(to_tiles(x, layout, pad_value=-7)).reshape(tiles, -1)
    theirs = np.asarray(to_tiles(x, flat, pad_value=-7)).reshape(tiles, -1)
    np.testing.assert_array_equal(mine, theirs)
    assert not layout.same_place(dataclasses.replace(flat, start=start + 1))


def test_layout_rejects_views_that_do_not_hold_the_shape() -> None:
    with pytest.raises(ValueError):
        Layout((4, 4), (15,), (1,))
    with pytest.raises(ValueError):
        Layout((4, 4), (16,), (0,))
    with pytest.raises(ValueError):
        Layout((4, 4), (16,), (2, 2))


def test_block_and_tile_bytes_by_hand() -> None:
    # view (10, 7) in a (3, 2) grid: blocks of ceil(10/3) = 4 by ceil(7/2) = 4, on 6 tiles.
    layout = Layout((70,), (10, 7), (3, 2), start=5)
    assert layout.block == (4, 4)
    assert layout.tiles == 6
    assert list(layout.tile_range()) == [5, 6, 7, 8, 9, 10]
    assert tile_bytes(layout, np.dtype(np.float32)) == 4 * 4 * 4


# ---- linear layout -------------------------------------------------------------------------

linear_cases = st.fixed_dictionaries(
    {
        "shape": st.lists(st.integers(0, 70), min_size=0, max_size=3).map(tuple),
        "itemsize": st.sampled_from([1, 2, 4, 8]),
        "tiles": st.one_of(st.integers(1, 40), st.just(1472)),
        "grain_bytes": st.sampled_from([4, 8, 16]),
        "min_bytes": st.sampled_from([0, 64, 128, 256]),
        "start": st.integers(0, 1500),
    }
)


def _linear(case: dict) -> Layout:
    return linear_layout(
        case["shape"],
        case["itemsize"],
        case["tiles"],
        grain_bytes=case["grain_bytes"],
        min_bytes=case["min_bytes"],
        start=case["start"],
    )


@given(linear_cases)
def test_linear_layout_stays_on_the_chip(case: dict) -> None:
    layout = _linear(case)
    elements = math.prod(case["shape"])
    assert layout.shape == case["shape"]
    assert layout.view == (elements,)
    assert 1 <= layout.tiles <= case["tiles"]  # never more tiles than the target has
    assert layout.start >= 0
    assert layout.start + layout.tiles <= case["tiles"]
    # The requested start is kept when the tensor fits from there, else it wraps to tile 0.
    fits = case["start"] + layout.tiles <= case["tiles"]
    assert layout.start == (case["start"] if fits else 0)


@given(linear_cases)
def test_linear_layout_has_no_empty_tile_and_enough_bytes(case: dict) -> None:
    layout = _linear(case)
    elements = math.prod(case["shape"])
    itemsize = case["itemsize"]
    (block,) = layout.block
    assert (layout.tiles - 1) * block < max(1, elements)  # every tile used holds something
    assert layout.tiles * block >= elements  # and together they hold it all
    grain = max(1, case["grain_bytes"] // itemsize)
    per_tile_min = max(grain, -(-case["min_bytes"] // itemsize))
    if elements >= per_tile_min:  # large enough: at least min_bytes on every tile
        assert block * itemsize >= case["min_bytes"]
    if elements >= 2 * per_tile_min and case["tiles"] > 1:  # and then it is spread
        assert layout.tiles > 1


@given(linear_cases)
@example(
    {"shape": (70,), "itemsize": 4, "tiles": 16, "grain_bytes": 8, "min_bytes": 128, "start": 0}
)
def test_linear_layout_blocks_are_whole_grains(case: dict) -> None:
    layout = _linear(case)
    grain = max(1, case["grain_bytes"] // case["itemsize"])
    if layout.tiles > 1:  # a run that ends on a tile boundary ends on a grain boundary
        assert layout.block[0] % grain == 0


def test_linear_layout_by_hand() -> None:
    # f32[4096] on 16 tiles, grain 8 B, at least 128 B: 32 elements minimum, 16 tiles used,
    # 256 elements each.
    layout = linear_layout((64, 64), 4, 16, grain_bytes=8, min_bytes=128)
    assert (layout.view, layout.grid, layout.block, layout.start) == ((4096,), (16,), (256,), 0)
    # f32[256]: 256 // 32 = 8 tiles of 32; from tile 8 it fits exactly (8 + 8 <= 16).
    layout = linear_layout((256,), 4, 16, grain_bytes=8, min_bytes=128, start=8)
    assert (layout.grid, layout.block, layout.start) == ((8,), (32,), 8)
    # From tile 9 it would run past tile 15, so it wraps to tile 0.
    assert linear_layout((256,), 4, 16, grain_bytes=8, min_bytes=128, start=9).start == 0
    # Smaller than the minimum: one tile, its run rounded up to a whole 2-element grain.
    layout = linear_layout((3,), 4, 16, grain_bytes=8, min_bytes=128, start=4)
    assert (layout.grid, layout.block, layout.start) == ((1,), (4,), 4)
    # Empty tensors still get a (single, empty) tile.
    layout = linear_layout((0, 5), 4, 16, grain_bytes=8, min_bytes=128)
    assert (layout.grid, layout.block) == ((1,), (0,))


@given(st.lists(st.integers(1, 3000), min_size=1, max_size=12), st.sampled_from([16, 1472]))
def test_consecutive_linear_tensors_spread_over_the_chip(sizes: list[int], tiles: int) -> None:
    # As the mapping context does: each tensor starts where the last one stopped.
    start = 0
    for size in sizes:
        layout = linear_layout((size,), 4, tiles, grain_bytes=8, min_bytes=128, start=start)
        assert layout.start + layout.tiles <= tiles
        assert layout.start == (start if start + layout.tiles <= tiles else 0)
        start = layout.stop % tiles


def test_small_tensors_do_not_all_start_on_tile_zero() -> None:
    # Twelve f32[8] tensors (one tile each) in a row take tiles 0..11 of 16; the next four
    # take 12..15 and then it wraps: 0, 1.
    start, starts = 0, []
    for _ in range(18):
        layout = linear_layout((8,), 4, 16, grain_bytes=8, min_bytes=128, start=start)
        starts.append(layout.start)
        start = layout.stop % 16
    assert starts == [*range(16), 0, 1]

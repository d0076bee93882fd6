"""The per-op tables of the cost model cover the vocabulary, and its formulas behave.

`cost.vector.VECTOR_OPS` prices every elementwise op; `tile_rules.movement.WHOLE_WORK` prices
every op the tile rules hand to the whole-tensor rule. The property tests check what any cost
formula must do: never charge less than nothing, never charge less for more work, and never
charge halves more than floats for the ops the AMP-less vector path runs fastest.

Monotone means: adding a whole vector to every worker never makes a vertex cheaper. Element by
element PopLibs' own formulas are not monotone at every step: a cast's remainder costs 1 + 2
cycles a bit (`castWorkerCycles`: 3 leftover floats cost more than a 4th that completes a
vector), a contiguous reduce pays 2 cycles for an odd number of partials
(`getCycleEstimateReduceAllRegionsContinuous`), and a transpose or reduce with fewer matrices
or outputs than workers splits each one over the workers (A).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import ipujax
from lowering import COLLECTIVES, ELEMENTWISE
from partitioner.cost.copies import copy_cycles, fill_cycles, slice_cycles, transpose_cycles
from partitioner.cost.vector import (
    VECTOR_OPS,
    binary_cycles,
    elementwise_cycles,
    reduce_cycles,
)
from partitioner.tiles.rules import _WHOLE, TILE_RULES
from partitioner.tiles.rules.movement import WHOLE_WORK
from partitioner.tiles.rules.whole import whole_tensor_tile_rule

BOW = ipujax.Target.bow()
WORKERS = BOW.threads_per_tile
# A whole natural vector (4 halves, the widest; 2 floats) on every worker, and twice that:
# stepping by it leaves every worker's remainder as it was.
STEP = WORKERS * 4
DTYPES = [np.dtype(d) for d in ("float32", "float16", "int32")]
RATED = ("unary", "binary")  # kinds priced by a rate of PopLibs' tables
OWN_VERTEX = ("select", "clamp", "cast")  # kinds priced by their own vertex's estimator

ops = st.sampled_from(sorted(VECTOR_OPS))
dtypes = st.sampled_from(DTYPES)
sizes = st.integers(min_value=0, max_value=5000)


def _elementwise(name: str, n: int, dtype: np.dtype) -> int:
    """The op on `n` elements of `dtype`; a convert to the other float type (f16 <-> f32)."""
    result = dtype
    if name == "convert":
        result = np.dtype(np.float32 if dtype == np.float16 else np.float16)
    return elementwise_cycles(name, n, dtype, result, BOW, "LT")


# ---- the tables ----------------------------------------------------------------------------


def test_vector_ops_cover_exactly_the_elementwise_ops() -> None:
    assert set(VECTOR_OPS) == set(ELEMENTWISE)


def test_composites_are_built_from_table_ops() -> None:
    for name, op in VECTOR_OPS.items():
        if op.kind == "composite":
            assert op.parts, name
            for part in op.parts:
                assert part in VECTOR_OPS, (name, part)
                assert VECTOR_OPS[part].kind != "composite", (name, part)
        else:
            assert not op.parts, name


def test_every_op_has_a_price() -> None:
    # An op PopLibs runs as a UnaryOp or BinaryOp vertex has a rate for at least one element
    # type (the others borrow the dearest); select, clamp and casts run vertices of their own
    # with their own estimators; only views (bitcasts) are free.
    kinds = {op.kind for op in VECTOR_OPS.values()}
    assert kinds <= {*RATED, *OWN_VERTEX, "view", "composite"}
    for name, op in VECTOR_OPS.items():
        if op.kind in RATED:
            assert any(r is not None for r in (op.float, op.half, op.int)), name
        if op.kind in ("view", "composite"):
            continue
        for dtype in DTYPES:
            assert _elementwise(name, 96, dtype) > 0, (name, dtype)
    assert {n for n, op in VECTOR_OPS.items() if op.kind == "view"} == {"bitcast_convert"}


def test_whole_work_covers_every_op_routed_to_the_whole_tensor_rule() -> None:
    # The whole-tensor rule runs the ops of `_WHOLE`, collectives (on tensors the collective
    # rule hands over), reshapes of tensors not mapped linearly, and elementwise ops whose
    # operands broadcast (`elementwise_tile_rule` falls back to it).
    routed = {*_WHOLE, *COLLECTIVES, "reshape", *ELEMENTWISE}
    assert routed <= set(WHOLE_WORK)
    assert {n for n, rule in TILE_RULES.items() if rule is whole_tensor_tile_rule} <= set(
        WHOLE_WORK
    )
    assert set(WHOLE_WORK) <= set(TILE_RULES)  # nothing priced that the vocabulary lacks


# ---- the formulas --------------------------------------------------------------------------


@given(ops, dtypes, sizes, st.integers(min_value=0, max_value=50))
def test_elementwise_costs_are_non_negative_and_monotone(
    name: str, dtype: np.dtype, n: int, vectors: int
) -> None:
    cycles = _elementwise(name, n, dtype)
    assert cycles >= 0
    assert cycles <= _elementwise(name, n + STEP * vectors, dtype)
    if name != "convert":  # a cast's remainder is not monotone (module docstring)
        assert cycles <= _elementwise(name, n + 1, dtype)


@given(st.sampled_from(["add", "multiply", "subtract"]), sizes)
def test_halves_are_never_slower_than_floats(name: str, n: int) -> None:
    f16, f32 = np.dtype(np.float16), np.dtype(np.float32)
    assert binary_cycles(name, n, f16, BOW) <= binary_cycles(name, n, f32, BOW)
    assert _elementwise(name, n, f16) <= _elementwise(name, n, f32)


@given(
    st.integers(min_value=0, max_value=100_000),
    st.integers(min_value=0, max_value=100_000),
    st.integers(min_value=1, max_value=4096),
)
def test_copy_costs_are_non_negative_and_monotone(nbytes: int, more: int, run: int) -> None:
    cycles = copy_cycles(nbytes, run)
    assert cycles >= 0
    assert cycles <= copy_cycles(nbytes + more, run)
    # Longer whole-word runs never copy slower than single elements of the same bytes.
    assert copy_cycles(nbytes, 8 * run) <= copy_cycles(nbytes, 2)


@given(
    st.integers(min_value=0, max_value=500),
    st.integers(min_value=0, max_value=100),
    st.integers(min_value=1, max_value=512),
    st.sampled_from([1, 2, 4]),
)
def test_slice_costs_are_non_negative_and_monotone(
    offsets: int, more: int, slice_bytes: int, itemsize: int
) -> None:
    cycles = slice_cycles(offsets, slice_bytes, itemsize, BOW)
    assert cycles >= 0
    assert cycles <= slice_cycles(offsets + more, slice_bytes, itemsize, BOW)
    assert cycles <= slice_cycles(offsets, slice_bytes + more, itemsize, BOW)


@given(sizes, st.integers(min_value=0, max_value=1000), dtypes)
def test_fill_costs_are_non_negative_and_monotone(n: int, more: int, dtype: np.dtype) -> None:
    assert 0 <= fill_cycles(n, dtype, BOW) <= fill_cycles(n + more, dtype, BOW)


@given(
    st.integers(min_value=0, max_value=60),
    st.integers(min_value=0, max_value=60),
    st.integers(min_value=1, max_value=64),
    st.integers(min_value=1, max_value=64),
    st.sampled_from([1, 2, 4, 8]),
)
def test_transpose_costs_are_non_negative_and_monotone(
    matrices: int, more: int, rows: int, cols: int, itemsize: int
) -> None:
    cycles = transpose_cycles(matrices, rows, cols, itemsize, BOW)
    assert cycles >= 0
    # Whole matrices more for every worker.
    assert cycles <= transpose_cycles(matrices + WORKERS * more, rows, cols, itemsize, BOW)
    if matrices >= WORKERS:  # whole matrices per worker: any more cost more
        assert cycles <= transpose_cycles(matrices + more, rows, cols, itemsize, BOW)


@given(
    st.integers(min_value=1, max_value=32).map(lambda q: 4 * q),
    st.integers(min_value=2, max_value=32).map(lambda q: 4 * q),
    st.integers(min_value=1, max_value=30),
    st.integers(min_value=0, max_value=30),
    st.sampled_from([2, 4]),
)
def test_fast_path_transposes_cost_more_with_more_matrices(
    rows: int, cols: int, matrices: int, more: int, itemsize: int
) -> None:
    # On the fast paths (multiples of 4 halves, at least 8 columns; even floats) one more
    # matrix never makes a tile faster, however few there are.
    assert transpose_cycles(matrices, rows, cols, itemsize, BOW) <= transpose_cycles(
        matrices + more, rows, cols, itemsize, BOW
    )


@given(
    st.integers(min_value=0, max_value=3000),
    st.integers(min_value=0, max_value=3000),
    st.integers(min_value=0, max_value=20),
    st.sampled_from([np.dtype(np.float32), np.dtype(np.float16)]),
    st.booleans(),
    st.integers(min_value=1, max_value=2),
)
def test_reduce_costs_are_non_negative_and_monotone(
    outputs: int, depth: int, more: int, dtype: np.dtype, contiguous: bool, operands: int
) -> None:
    cycles = reduce_cycles(outputs, depth, dtype, contiguous, operands, BOW)
    assert cycles >= 0
    # Partials in whole pairs per worker, whatever the split of an output over the workers
    # (6 // outputs ways: 1, 2, 3 or 6, all dividing 12).
    assert cycles <= reduce_cycles(outputs, depth + 12 * more, dtype, contiguous, operands, BOW)
    if outputs >= WORKERS:  # every worker has whole outputs: any more cost more
        bigger = reduce_cycles(outputs + more, depth, dtype, contiguous, operands, BOW)
        assert cycles <= bigger
    if not contiguous:  # the strided vertex: monotone in both, step by step
        assert cycles <= reduce_cycles(outputs, depth + 1, dtype, False, operands, BOW)
        assert cycles <= reduce_cycles(outputs + 1, depth, dtype, False, operands, BOW)

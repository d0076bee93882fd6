"""Imports kept inside `imports_reused()` (`lowering/import_reuse`): a module lowered again, by
another function object making the same program, reuses the graph imported the first time;
another program, a program with a host callback, and anything outside the block are imported
afresh; a block inside another shares its imports. The plan search's rankings with and
without reuse are compared in tests/ipujax/test_plan_reuse.py."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np

from lowering import KeptImports, imports_reused, interpret, lower

X = jax.ShapeDtypeStruct((4, 8), jnp.float32)


def _make(scale: float):
    def step(x: jax.Array) -> jax.Array:  # a new function object each time
        return jnp.tanh(x * scale).sum(axis=0)

    return step


def _lowered(*steps, x=X) -> list:
    # one call site: jax locates what a lowering makes at its caller's line and column
    return [lower(step, x) for step in steps]


def test_the_same_module_is_imported_once() -> None:
    with imports_reused() as kept:
        # another function object making the same program, then another constant
        first, again, other = _lowered(_make(2.0), _make(2.0), _make(3.0))
        (wider,) = _lowered(_make(2.0), x=jax.ShapeDtypeStruct((4, 9), jnp.float32))
    assert again.ops is first.ops and again.inputs is first.inputs
    assert other.ops is not first.ops and wider.ops is not first.ops
    assert (kept.made, kept.reused) == (3, 1)
    # outside the block, nothing is kept
    assert _lowered(_make(2.0))[0].ops is not first.ops
    x = np.arange(32, dtype=np.float32).reshape(4, 8) / 32
    (got,) = interpret(again, [x])
    np.testing.assert_array_equal(got, jax.jit(_make(2.0))(x))


def test_a_module_with_a_host_callback_is_not_kept() -> None:
    def step(x: jax.Array) -> jax.Array:
        y = jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        return y * 2

    with imports_reused() as kept:
        first, again = _lowered(step, step)
    assert again.ops is not first.ops
    assert (kept.made, kept.reused) == (0, 0)


def test_a_block_inside_another_shares_its_imports() -> None:
    # A plan-search worker keeps one block open across its jobs, each of which opens its own.
    graphs, stores = [], []
    with imports_reused() as outer:
        for nested in (False, True):
            with imports_reused() if nested else contextlib.nullcontext(outer) as store:
                graphs += _lowered(_make(2.0))  # one call site: the same module twice
                stores.append(store)
    assert stores == [outer, outer]
    assert graphs[1].ops is graphs[0].ops
    assert (outer.made, outer.reused) == (1, 1)


def test_the_same_program_from_another_line_is_imported_again() -> None:
    # Only its source locations differ, and the importer reads them: each op keeps its line.
    with imports_reused() as kept:
        first = lower(_make(2.0), X)
        other = lower(_make(2.0), X)
    assert other.ops is not first.ops
    assert (kept.made, kept.reused) == (2, 0)
    assert {op.loc.line for op in first.ops} != {op.loc.line for op in other.ops}


def test_a_given_store_outlives_its_blocks() -> None:
    # A plan-search worker keeps one store and opens a block on it for each of its jobs.
    store, graphs = KeptImports(), []
    for _ in range(2):
        with imports_reused(store) as kept:
            assert kept is store
            graphs += _lowered(_make(2.0))  # one call site: the same module twice
    assert graphs[1].ops is graphs[0].ops
    assert (store.made, store.reused) == (1, 1)

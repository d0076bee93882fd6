"""Differential oracle: `lowering.evaluate(lowering.lower(f, ...))` and `ipujax.jit(f)` on one
virtual IPU must agree with `jax.jit(f)`.

Integer and bool leaves must match exactly; floating leaves within a per-dtype tolerance, with
NaNs in the same places counted as equal.
"""

import dataclasses
from collections.abc import Callable

import jax
import ml_dtypes
import numpy as np
import pytest

import ipujax
import lowering

# (rtol, atol) per floating dtype name.
TOLERANCES = {
    "float64": (1e-12, 1e-12),
    "float32": (1e-5, 1e-6),
    "float16": (2e-3, 2e-3),
    "bfloat16": (1.6e-2, 1.6e-2),
    "complex64": (1e-5, 1e-6),
    "complex128": (1e-12, 1e-12),
}


def tolerance(dtype) -> tuple[float, float]:
    """(rtol, atol) used to compare leaves of `dtype`."""
    return TOLERANCES[np.dtype(dtype).name]


def _is_floating(dtype: np.dtype) -> bool:
    return np.issubdtype(dtype, np.inexact) or dtype == np.dtype(ml_dtypes.bfloat16)


def assert_leaf_matches(got, expected, where: str = "result") -> None:
    """One array leaf: same shape and dtype, then exact or tolerance-bounded equality."""
    expected = np.asarray(expected)
    got = np.asarray(got)
    assert got.shape == expected.shape, f"{where}: shape {got.shape} != jit's {expected.shape}"
    assert got.dtype == expected.dtype, f"{where}: dtype {got.dtype} != jit's {expected.dtype}"
    if _is_floating(expected.dtype):
        rtol, atol = tolerance(expected.dtype)
        wide = {"float64": np.float64, "complex64": np.complex64, "complex128": np.complex128}
        wide = wide.get(expected.dtype.name, np.float32)
        np.testing.assert_allclose(
            np.asarray(got, wide),
            np.asarray(expected, wide),
            rtol=rtol,
            atol=atol,
            equal_nan=True,
            err_msg=where,
        )
    else:
        np.testing.assert_array_equal(got, expected, err_msg=where)


def assert_trees_match(got, expected) -> None:
    """Same pytree structure (None leaves included), then every leaf via `assert_leaf_matches`."""
    got_struct = jax.tree.structure(got)
    expected_struct = jax.tree.structure(expected)
    assert got_struct == expected_struct, f"tree {got_struct} != jit's {expected_struct}"
    flat_expected, _ = jax.tree_util.tree_flatten_with_path(expected)
    for (path, want), have in zip(flat_expected, jax.tree.leaves(got), strict=True):
        assert_leaf_matches(have, want, where="result" + jax.tree_util.keystr(path))


# The tile runtime runs the same suite: on a small IPU (few tiles, many elements per tile) and
# on a whole Bow IPU (1,472 tiles, small tensors spread thin).
IPU_TARGETS = {
    "bow-16-tiles": ipujax.Target.bow().with_tiles(16),
    "bow": ipujax.Target.bow(),
}


def assert_matches_jit(f, *args, **kwargs):
    """Lower `f`, verify the graph, evaluate it, and run it with `ipujax.jit` on each IPU target;
    every result must match `jax.jit(f)`. Returns the graph."""
    expected = jax.jit(f)(*args, **kwargs)
    graph = lowering.lower(f, *args, **kwargs)
    assert lowering.verify(graph) is None
    got = lowering.evaluate(graph, *args, **kwargs)
    assert_trees_match(got, expected)
    for name, target in IPU_TARGETS.items():
        mesh = ipujax.make_mesh((1,), ("ipu",), target=target)
        try:
            on_ipu = ipujax.jit(f, mesh=mesh)(*args, **kwargs)
        except Exception as error:
            raise AssertionError(f"ipujax.jit on {name} failed: {error}") from error
        assert_trees_match(on_ipu, expected)
    return graph


def op_names(graph) -> set[str]:
    """Names of every op in `graph`, nested regions included."""
    return {op.name for op in lowering.walk(graph)}


# ---------------------------------------------------------------------------------------------
# Inputs and parametrized cases shared by the op-level test modules.

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), BF16)


def uniform(shape, lo=-3.0, hi=3.0, dtype=np.float32, seed=0) -> np.ndarray:
    """Deterministic floats in [lo, hi), rounded to `dtype`."""
    values = np.random.RandomState(seed).uniform(lo, hi, size=shape)
    return values.astype(np.float32).astype(dtype)


def integers(shape, dtype=np.int32, lo=None, hi=None, seed=0) -> np.ndarray:
    """Deterministic integers of `dtype` in [lo, hi] (default: the dtype's whole range)."""
    info = np.iinfo(dtype)
    lo = info.min if lo is None else lo
    hi = info.max if hi is None else hi
    rng = np.random.RandomState(seed)
    return rng.randint(lo, hi + 1, size=shape, dtype=np.int64).astype(dtype)


def bools(shape, seed=0) -> np.ndarray:
    return np.random.RandomState(seed).rand(*shape) < 0.5


@dataclasses.dataclass(frozen=True)
class Case:
    """A differential test case: `fn(*args)` must match jit and its graph must contain `ops`."""

    id: str
    fn: Callable
    args: tuple
    ops: frozenset[str]


def case(ops: str, fn: Callable, *args, id: str | None = None) -> Case:
    """`ops` is a space-separated list of op names the lowered graph must contain."""
    names = frozenset(ops.split())
    return Case(id or "-".join(sorted(names)), fn, args, names)


def params(cases) -> list:
    """pytest params with readable, unique ids."""
    seen: dict[str, int] = {}
    out = []
    for c in cases:
        n = seen[c.id] = seen.get(c.id, 0) + 1
        out.append(pytest.param(c, id=c.id if n == 1 else f"{c.id}#{n}"))
    return out


_GRAPHS: dict[int, object] = {}


def run_case(c: Case):
    """Check `c` against jit and that its graph holds the ops it claims; cache the graph."""
    graph = assert_matches_jit(c.fn, *c.args)
    missing = c.ops - op_names(graph)
    assert not missing, f"{c.id}: expected ops {sorted(missing)} in graph, got {op_names(graph)}"
    _GRAPHS[id(c)] = graph
    return graph


def lowered(c: Case):
    """The graph of `c`, from the cache when `run_case` already lowered it."""
    if id(c) not in _GRAPHS:
        _GRAPHS[id(c)] = lowering.lower(c.fn, *c.args)
    return _GRAPHS[id(c)]

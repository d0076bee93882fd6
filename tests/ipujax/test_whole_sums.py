"""The runtime's whole sums (`runtime/whole_sums`): under `numerics="exact"` every reduction,
alone or ending a fused chain, runs as the op itself (jax.jit's order of additions, no padded
runs); under "ipu" the staged kernels stay; the cost report is the same either way."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ipujax
from ipujax.runtime.passes import Placement, prepare
from partitioner import whole_kernel

X = np.random.default_rng(1).standard_normal((5, 3_001)).astype(np.float32)


def _step(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    # a plain sum, and a mean of a chain (a fusion whose root is the reduction), of two tensors
    # (of one, they would be siblings, one fusion: tests/partitioner/test_siblings.py)
    return x.sum(axis=1), jnp.mean(jnp.tanh(y) * 2.0 + 1.0, axis=1)


def _reducing(program: object) -> list:
    return [t for t in program.tasks if any(m.name == "reduce" for m in _members(t.op))]


def _members(op: object) -> tuple:
    return op.regions[0].ops if op.name == "fusion" else (op,)


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")
def test_exact_sums_run_whole_and_ipu_sums_staged() -> None:
    compiled = ipujax.jit(_step).lower(X, X).compile()
    program = compiled.program
    reducing = _reducing(program)
    assert {t.op.name for t in reducing} == {"reduce", "fusion"}
    assert all(len(t.supersteps) >= 2 for t in reducing)  # split over tiles: staged stages
    exact = prepare(program, Placement({}, numerics="exact"))
    staged = prepare(program, Placement({}, numerics="ipu"))
    for before, whole, kept in zip(reducing, _reducing(exact), _reducing(staged), strict=True):
        assert whole.kernel is not before.kernel and kept.kernel is before.kernel
        assert whole.supersteps == before.supersteps  # only the simulator's kernel changes
        # the whole kernel is the op itself: jax.jit's numbers, bit for bit
        arrays = [X if v.shape == X.shape else np.float32(0) for v in before.inputs]
        want = whole_kernel(before.op, before.inputs)(*arrays)
        for a, b in zip(whole.kernel(*arrays), want, strict=True):
            np.testing.assert_array_equal(a, b)
    want = jax.jit(_step)(X, X)
    for a, b in zip(compiled(X, X), want, strict=True):
        np.testing.assert_array_equal(a, b)
    with ipujax.numerics_key(jax.random.key(0)):
        ipu = ipujax.jit(_step, numerics="ipu").lower(X, X).compile()
        report = dataclasses.replace(ipu.cost_report(), numerics="exact")
        assert report == compiled.cost_report()  # the same figures: only `numerics` differs
        for a, b in zip(ipu(X, X), want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)

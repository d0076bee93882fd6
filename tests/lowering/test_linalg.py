"""Linear algebra on one IPU: `jnp.linalg.cholesky`, `solve`, `jax.scipy.linalg.solve_triangular`
and `lu_factor` (LAPACK custom calls on CPU) give `jax.jit`'s values bit for bit, through the
evaluator and `ipujax.jit`, and cost what PopLibs' blocked Cholesky costs (hand-derived)."""

import math

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from oracle import assert_matches_jit, op_names

import ipujax
import lowering
from partitioner.cost.linalg import LINALG_BLOCK
from partitioner.tiles.matmul_plan import plan_matmul


def spd(n: int, batch: tuple[int, ...] = (), dtype=np.float32, seed: int = 0) -> np.ndarray:
    """A well-conditioned symmetric positive definite matrix (or a batch of them)."""
    m = np.random.RandomState(seed).normal(size=(*batch, n, n))
    if np.issubdtype(dtype, np.complexfloating):
        m = m + 1j * np.random.RandomState(seed + 1).normal(size=(*batch, n, n))
    a = m @ np.conj(np.swapaxes(m, -1, -2)) + n * np.eye(n)
    return a.astype(dtype)


def rhs(n: int, k: int, batch: tuple[int, ...] = (), seed: int = 1) -> np.ndarray:
    return np.random.RandomState(seed).normal(size=(*batch, n, k)).astype(np.float32)


def assert_bit_exact(f, *args) -> None:
    """`ipujax.jit(f)` on one Bow IPU returns exactly `jax.jit(f)`'s arrays: the same LAPACK
    kernels run on the same operands."""
    expected = jax.jit(f)(*args)
    got = ipujax.jit(f)(*args)
    for have, want in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(have), np.asarray(want))


def test_cholesky_imports_lapack_potrf_and_matches_jit() -> None:
    a = spd(12)
    graph = assert_matches_jit(jnp.linalg.cholesky, a)
    assert "cholesky" in op_names(graph)
    assert_bit_exact(jnp.linalg.cholesky, a)


def test_batched_cholesky_matches_jit() -> None:
    a = spd(6, (3, 2))
    assert_matches_jit(jnp.linalg.cholesky, a)
    assert_bit_exact(jnp.linalg.cholesky, a)


def test_a_failed_cholesky_is_nan_as_jit_makes_it() -> None:
    """An indefinite matrix: LAPACK's info is positive, and jax turns the factor into NaN."""
    a = -spd(5)
    out = ipujax.jit(jnp.linalg.cholesky)(a)
    assert np.isnan(np.asarray(out)[np.tril_indices(5)]).all()
    assert_matches_jit(jnp.linalg.cholesky, a)


def test_solve_runs_getrf_then_trsm_and_matches_jit() -> None:
    a, b = spd(9, seed=3), rhs(9, 4)
    a = a + np.triu(np.ones((9, 9), np.float32), 1)  # not symmetric: pivoting matters
    graph = assert_matches_jit(jnp.linalg.solve, a, b)
    assert {"lu", "triangular_solve"} <= op_names(graph)
    assert_bit_exact(jnp.linalg.solve, a, b)


def test_batched_solve_of_a_vector_matches_jit() -> None:
    a, b = spd(5, seed=4), rhs(5, 1)[:, 0]
    assert_bit_exact(jnp.linalg.solve, a, b)
    assert_bit_exact(jnp.linalg.solve, spd(5, (2,), seed=4), rhs(5, 2, (2,)))


def test_lu_factor_pivots_and_info_are_lapacks() -> None:
    """lu_factor returns getrf's pivots (0-based in jax); a singular matrix keeps its zero pivot
    and jax's info-dependent NaN select does not fire (getrf's info >= 0)."""
    singular = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]], np.float32)
    for a in (spd(7, seed=5) + np.tril(np.ones((7, 7), np.float32)), singular):
        assert_bit_exact(jsl.lu_factor, a)


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("trans", [0, 1])
@pytest.mark.parametrize("unit_diagonal", [False, True])
def test_solve_triangular_every_form_matches_jit(lower: bool, trans: int, unit_diagonal: bool):
    a, b = spd(6, seed=6), rhs(6, 3)

    def solve(a, b):
        return jsl.solve_triangular(a, b, lower=lower, trans=trans, unit_diagonal=unit_diagonal)

    assert_bit_exact(solve, a, b)


def test_solve_triangular_on_the_right_and_in_half_precision() -> None:
    """f16 has no LAPACK kernel: jax emits StableHLO's triangular_solve, the same IR op."""
    a, b = spd(4, seed=7), rhs(3, 4)

    def right(a, b):
        return jax.lax.linalg.triangular_solve(a, b, left_side=False, lower=True)

    assert_bit_exact(right, a, b)
    half = jnp.asarray(spd(4, seed=8), jnp.float16), jnp.asarray(rhs(4, 2), jnp.float16)
    graph = assert_matches_jit(lambda a, b: jsl.solve_triangular(a, b, lower=True), *half)
    assert "triangular_solve" in op_names(graph)


@given(n=st.integers(1, 20), k=st.integers(1, 4), seed=st.integers(0, 1000))
def test_cholesky_solve_of_any_size_is_jits(n: int, k: int, seed: int) -> None:
    """A Cholesky solve (potrf, then trsm twice) of any order gives jax.jit's arrays exactly."""
    a, b = spd(n, seed=seed), rhs(n, k, seed=seed + 1)

    def cho(a, b):
        return jsl.cho_solve(jsl.cho_factor(a, lower=True), b)

    assert_bit_exact(cho, a, b)


def test_lapack_routines_ipujax_does_not_run_name_the_line_and_the_fix() -> None:
    def qr(a):
        return jnp.linalg.qr(a)[0]

    with pytest.raises(lowering.UnsupportedOpError) as error:
        ipujax.jit(qr).lower(spd(4))
    message = str(error.value)
    assert "lapack_sgeqrf_ffi" in message and "test_linalg.py" in message
    assert "outside the function given to ipujax.jit" in message


def test_batches_of_matrices_split_over_ipus() -> None:
    """A batch of factorisations splits over a mesh axis; each IPU factors its matrices."""
    mesh = ipujax.make_mesh((2,), ("dp",), target=ipujax.Target.bow().with_tiles(64))
    a, b = spd(6, (4,), seed=9), rhs(6, 2, (4,))
    spec = jax.sharding.PartitionSpec("dp")
    jitted = ipujax.jit(jnp.linalg.solve, mesh=mesh, in_shardings=(spec, spec))
    np.testing.assert_array_equal(
        np.asarray(jitted(a, b)), np.asarray(jax.jit(jnp.linalg.solve)(a, b))
    )
    assert "[{dp}, {}, {}]  <- propagated through lu" in jitted.lower(a, b).compile().explain()


# ---- cost --------------------------------------------------------------------------------------

BOW = ipujax.Target.bow()


def _steps(report, prefix: str) -> dict:
    return {s.name: s for s in report.supersteps if s.name.startswith(prefix)}


def test_one_block_cholesky_costs_one_vertex_by_hand() -> None:
    """An 8 x 8 f32 Cholesky is one PopLibs block: one `poplin::Cholesky` vertex on one worker.
    LAPACK's count: (2 n^3 + 3 n^2 + n) / 6 = (1024 + 192 + 8) / 6 = 204 FLOPs. The vertex:
    n^3/3 = 170 FLOPs at 2 f32 lanes x a multiply-add (4 FLOPs) per thread cycle = 43 thread
    cycles, x 6 workers in the barrel = 258 tile cycles; the 8 x 8 x 4 = 256 B block exchanged
    to its tile, 256 / 4 + 100 = 164 cycles; one sync, 90: 512 cycles."""
    report = ipujax.jit(jnp.linalg.cholesky).lower(spd(8)).compile().cost_report()
    (step,) = _steps(report, "cholesky").values()
    assert step.name == "cholesky.factorise"
    assert (step.compute_cycles, step.exchange_cycles, step.sync_cycles) == (258, 164, 90)
    assert step.flops == 204
    assert step.cycles == 512


def test_two_block_cholesky_costs_poplins_blocks_by_hand() -> None:
    """16 x 16: two blocks of 8. Each block's factorise: 258 + 164 + 90 (as above), twice:
    compute 516, exchange 328, sync 180. After the first block, its inverse: ceil(8 / 6) = 2
    `TriangularInverseWithTranspose` vertices on 2 tiles, each 170 / 2 = 85 FLOPs = 22 thread
    cycles = 132 tile cycles, the 256 B block exchanged (164), a sync (90). Then the panel
    A21 inv(A11)^T, an [8, 8] x [8, 8] matmul, and the update A22 - A21 A21^T, [8, 8] x [8, 8]:
    each `plan_matmul`'s cycles plus the subtract of its 64 results spread over its tiles."""
    report = ipujax.jit(jnp.linalg.cholesky).lower(spd(16)).compile().cost_report()
    steps = _steps(report, "cholesky")
    assert list(steps) == [
        "cholesky.factorise", "cholesky.invert", "cholesky.panel", "cholesky.update"
    ]  # fmt: skip
    factorise, invert = steps["cholesky.factorise"], steps["cholesky.invert"]
    assert (factorise.compute_cycles, factorise.exchange_cycles) == (516, 328)
    assert factorise.sync_cycles == 180
    assert (invert.compute_cycles, invert.exchange_cycles, invert.sync_cycles) == (132, 164, 90)
    assert invert.tiles == 2
    plan = plan_matmul(1, 8, 8, 8, np.dtype(np.float32), 4, BOW, np.dtype(np.float32))
    from partitioner.cost.vector import binary_cycles

    subtract = binary_cycles("subtract", math.ceil(64 / plan.tiles), np.float32, BOW, True)
    for name in ("cholesky.panel", "cholesky.update"):
        assert steps[name].cycles == plan.cycles + subtract, name
    # LAPACK's count for n = 16: (2 * 4096 + 3 * 256 + 16) / 6 = 1496 FLOPs, on the first step.
    assert factorise.flops == 1496 and sum(s.flops for s in steps.values()) == 1496


def test_cholesky_blocks_grow_with_the_order() -> None:
    """n = 64 runs 64 / 8 = 8 blocks: 8 factorise vertices, 7 inverses and 14 matmuls; its
    cycles grow faster than linearly in n (the trailing updates)."""
    assert LINALG_BLOCK == 8
    costs = {}
    for n in (16, 32, 64):
        report = ipujax.jit(jnp.linalg.cholesky).lower(spd(n)).compile().cost_report()
        costs[n] = sum(s.cycles for s in _steps(report, "cholesky").values())
    assert costs[32] > 2 * costs[16] and costs[64] > 2 * costs[32]

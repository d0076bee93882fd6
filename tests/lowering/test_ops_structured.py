"""Data movement, contractions, reductions, indexing, sorting and control flow vs jax.jit.

The last test checks that the cases of this module and `test_ops` together exercise every op of
`lowering.VOCABULARY`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_ops
from jax import lax
from oracle import BF16, bools, case, integers, lowered, op_names, params, run_case, uniform

import lowering
from lowering.vocabulary import COLLECTIVES, FUSIONS, SHARD_OPS

X34 = uniform((3, 4))
X234 = uniform((2, 3, 4), seed=1)

SHAPE_CASES = [
    case(
        "iota",
        lambda x: (
            x + lax.broadcasted_iota(jnp.float32, (3, 4), 1),
            lax.broadcasted_iota(jnp.int32, (2, 3), 0),
            lax.iota(jnp.uint8, 5),
        ),
        X34,
    ),
    case(
        "constant",
        lambda x: (
            x * np.arange(12, dtype=np.float32).reshape(3, 4) + 1.5,
            np.array([1, -2, 3], np.int8),
            np.array([[True, False]]),
            x.astype(jnp.bfloat16) * np.array([0.5, 2.0, -1.0, 3.0], BF16),
        ),
        X34,
    ),
    case(
        "broadcast_in_dim",
        lambda x, v: (
            jnp.broadcast_to(x[:, None, :], (3, 5, 4)),
            lax.broadcast_in_dim(v, (2, 3, 4), (1, 2)),
            x + v[:, :1],
        ),
        X34,
        uniform((3, 1), seed=2),
    ),
    case(
        "reshape",
        lambda x, s: (x.reshape(4, 3), x.reshape(-1), x.reshape(2, 1, 6), s.reshape(1, 1), x[None]),
        X34,
        np.float32(2.0),
    ),
    case("transpose", lambda x: (x.transpose(2, 0, 1), x.transpose(1, 2, 0), x.T), X234),
    case(
        "slice",
        lambda x: (x[1:3, ::2], lax.slice(x, (0, 1, 0), (2, 3, 4), (1, 2, 3)), x[-1]),
        X234,
    ),
    case(
        "dynamic_slice",
        lambda x, i, j: (lax.dynamic_slice(x, (i, j), (2, 3)), lax.dynamic_index_in_dim(x, j, 1)),
        X34,
        1,
        -2,
        id="dynamic_slice-negative-index",
    ),
    case(
        "dynamic_slice",
        lambda x, i, j: lax.dynamic_slice(x, (i, j), (2, 2)),
        X34,
        np.int32(7),
        np.int32(3),
        id="dynamic_slice-clamped",
    ),
    # A start still negative after jax's own wrap (-7 + 4) reaches StableHLO, which clamps it to
    # 0; counting it from the end once more, as jax.lax does, would start at 1.
    case(
        "dynamic_slice dynamic_update_slice",
        lambda x, i, j: (
            lax.dynamic_slice(x, (i, j), (2, 2)),
            lax.dynamic_update_slice(x, x[:2, :2] * 10, (i, j)),
        ),
        X34,
        np.int32(-9),
        np.int32(-7),
        id="dynamic_slice-below-range",
    ),
    case(
        "dynamic_update_slice",
        lambda x, u, i, j: (
            lax.dynamic_update_slice(x, u, (i, j)),
            lax.dynamic_update_slice(x, u, (j, i)),
        ),
        X34,
        uniform((2, 2), seed=3),
        np.int32(1),
        np.int32(9),
    ),
    case(
        "concatenate",
        lambda a, b, c, p: (jnp.concatenate([a, b, c], axis=1), jnp.concatenate([p, p, ~p])),
        X34,
        uniform((3, 1), seed=1),
        uniform((3, 2), seed=2),
        bools((4,)),
    ),
    case(
        "pad",
        lambda x, i: (
            lax.pad(x, np.float32(0.5), [(1, 2, 0), (-1, 1, 2)]),
            lax.pad(x, np.float32(-1), [(-1, -1, 1), (2, -2, 0)]),
            lax.pad(i, np.int8(7), [(0, 0, 3), (1, 0, 0)]),
        ),
        X34,
        integers((2, 3), np.int8),
    ),
    case("reverse", lambda x: (jnp.flip(x, (0, 2)), x[::-1]), X234),
]


@pytest.mark.parametrize("c", params(SHAPE_CASES))
def test_shape_ops(c):
    run_case(c)


def conv(x, w, **kw):
    return lax.conv_general_dilated(x, w, dimension_numbers=("NHWC", "HWIO", "NHWC"), **kw)


CONTRACT_CASES = [
    case("dot_general", jnp.dot, X34, uniform((4, 5), seed=2), id="matmul"),
    case(
        "dot_general",
        lambda a, b: jnp.einsum("bij,bjk->bik", a, b),
        X234,
        uniform((2, 4, 3), seed=2),
        id="batch-matmul",
    ),
    case(
        "dot_general",
        lambda a, b, c: (jnp.einsum("abc,bcd->ad", a, b), jnp.einsum("ibj,jbk->bki", a, c)),
        X234,
        uniform((3, 4, 2), seed=3),
        uniform((4, 3, 5), seed=4),
        id="multi-contract",
    ),
    case(
        "dot_general",
        lambda a, b, p, q: (
            lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32),
            lax.dot_general(p, q, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32),
            jnp.matmul(a.astype(jnp.float16), b.astype(jnp.float16)),
        ),
        X34.astype(BF16),
        uniform((4, 2), seed=4).astype(BF16),
        integers((3, 4), np.int8),
        integers((4, 2), np.int8, seed=1),
        id="mixed-precision",
    ),
    case(
        "convolution",
        lambda x, w: conv(x, w, window_strides=(2, 1), padding=((1, 0), (2, 1))),
        uniform((2, 6, 5, 3)),
        uniform((3, 2, 3, 4), seed=1),
        id="conv-stride-pad",
    ),
    case(
        "convolution",
        lambda x, w: conv(x, w, window_strides=(1, 1), padding="SAME", rhs_dilation=(2, 1)),
        uniform((1, 6, 5, 2)),
        uniform((2, 2, 2, 3), seed=1),
        id="conv-dilated",
    ),
    case(
        "convolution",
        lambda x, w: conv(
            x,
            w,
            window_strides=(1, 1),
            padding=((0, 0), (1, 0)),
            feature_group_count=2,
            lhs_dilation=(2, 1),
        ),
        uniform((2, 4, 4, 4)),
        uniform((2, 2, 2, 6), seed=1),
        id="conv-groups-lhs-dilation",
    ),
    case(
        "convolution",
        lambda x, w: jax.grad(lambda w: conv(x, w, window_strides=(1, 1), padding="SAME").sum())(w),
        uniform((2, 5, 5, 3)),
        uniform((3, 3, 3, 2), seed=1),
        id="conv-weight-grad",
    ),
    case(
        "convolution",
        lambda x, w: lax.conv(x, w, (1,), "SAME"),
        uniform((2, 3, 8), dtype=BF16),
        uniform((4, 3, 3), seed=1, dtype=BF16),
        id="conv1d-bf16",
    ),
]


@pytest.mark.parametrize("c", params(CONTRACT_CASES))
def test_contractions(c):
    run_case(c)


def avg_pool(x):
    window = (1, 2, 2, 1)
    total = lax.reduce_window(x, 0.0, lax.add, window, (1, 1, 1, 1), "SAME")
    return total / 4.0


REDUCE_CASES = [
    case(
        "reduce",
        lambda x: (x.sum(0), x.max(1), x.min((0, 2)), jnp.prod(x, 2), x.sum()),
        X234,
        id="reduce-float",
    ),
    case(
        "reduce",
        lambda i, u, p: (i.sum(1), i.max(0), u.min(), p.all(1), p.any(0)),
        integers((3, 4), np.int32, -100, 100),
        integers((3, 4), np.uint8),
        bools((3, 4)),
        id="reduce-int-bool",
    ),
    case(
        "reduce",
        lambda x, i: (jnp.argmax(x, 1), jnp.argmin(x, 0), jnp.argmax(i), x.astype(BF16).sum(1)),
        X34,
        integers((5,), np.int32, 0, 2),
        id="reduce-argmax",
    ),
    case(
        "reduce_window",
        lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
        uniform((2, 4, 6, 3)),
        id="max-pool",
    ),
    case("reduce_window", avg_pool, uniform((1, 5, 5, 2)), id="avg-pool"),
    case(
        "reduce",
        lambda x: (
            lax.reduce(x, 5.0, lax.add, (1,)),
            lax.reduce(x, 0.5, lax.max, (0,)),
            lax.reduce_window(x, 1.0, lax.add, (2, 2, 1), (1, 1, 1), "VALID"),
        ),
        X234,
        id="reduce-from-a-start-not-the-identity",
    ),
    case(
        "reduce_window",
        lambda x, i: (
            jnp.cumsum(x, 1),
            lax.cummax(i, 0),
            lax.reduce_window(x, 0.0, lax.add, (2, 2), (1, 2), ((1, 1), (0, 1)), None, (1, 2)),
        ),
        uniform((4, 6)),
        integers((5, 2), np.int32, -9, 9),
        id="cumulative-dilated",
    ),
]


@pytest.mark.parametrize("c", params(REDUCE_CASES))
def test_reductions(c):
    run_case(c)


IDX = np.array([2, 0, -1, 2], np.int32)
OOB = np.array([1, 7, -9], np.int32)

INDEX_CASES = [
    case(
        "gather",
        lambda x, i: (x[i], x[:, i], x[i, 1:3], x[1, 2]),
        uniform((5, 4)),
        IDX[:3],
        id="gather-indexing",
    ),
    case(
        "gather",
        lambda x, i: (
            jnp.take_along_axis(x, i, axis=1),
            jnp.take(x, OOB, axis=0, mode="clip"),
            jnp.take(x, OOB, axis=1, mode="fill", fill_value=-5.0),
        ),
        uniform((4, 3)),
        integers((4, 2), np.int32, 0, 2),
        id="gather-take",
    ),
    case(
        "scatter",
        lambda x, i, v: (x.at[i].set(v), x.at[i].add(v), x.at[i].multiply(v)),
        uniform((6, 3)),
        np.array([4, 0, 2], np.int32),
        uniform((3, 3), seed=1),
        id="scatter-set-add-mul",
    ),
    case(
        "scatter",
        lambda x, i, v: (x.at[:, i].min(v), x.at[:, i].max(v), x.at[i % 4, 1].add(1)),
        integers((4, 5), np.int32, -50, 50),
        np.array([3, 3, 0, 7], np.int32),  # a duplicate and an out-of-range index
        integers((4, 4), np.int32, -50, 50, seed=2),
        id="scatter-min-max-int",
    ),
    case(
        "sort",
        lambda x, i: (jnp.sort(x), jnp.sort(x, axis=0), jnp.argsort(x, axis=1), jnp.sort(i)),
        np.round(uniform((4, 6)), 1),  # rounding makes ties, which argsort must keep stable
        integers((7,), np.uint8),
        id="sort-argsort",
    ),
    case(
        "sort",
        lambda a, b, c: (lax.sort((a, b, c), num_keys=2), jnp.sort(c, descending=True)),
        integers((8,), np.int32, 0, 2),
        integers((8,), np.int32, 0, 3, seed=1),
        uniform((8,), dtype=BF16),
        id="sort-two-keys-descending",
    ),
    case("top_k", lambda x: lax.top_k(x, 3), np.round(uniform((3, 7)), 1)),
]


@pytest.mark.parametrize("c", params(INDEX_CASES))
def test_indexing_and_sorting(c):
    run_case(c)


@jax.jit
def helper(y):
    return jnp.sin(y) * 2.0 + y


def collatz_steps(n):
    def body(state):
        n, steps = state
        return jnp.where(n % 2 == 0, n // 2, 3 * n + 1), steps + 1

    return lax.while_loop(lambda s: s[0] > 1, body, (n, jnp.int32(0)))[1]


BRANCHES = [jnp.sin, lambda x: x * 3.0, lambda x: -jnp.abs(x)]

CONTROL_CASES = [
    case("while", jax.vmap(collatz_steps), np.array([1, 6, 7, 27], np.int32), id="while-collatz"),
    case(
        "while",
        lambda x, n: lax.fori_loop(0, n, lambda i, c: c * 0.9 + jnp.float32(i), x),
        X34,
        np.int32(5),
        id="fori-dynamic",
    ),
    case("while", lambda x: lax.fori_loop(0, 3, lambda i, c: jnp.tanh(c @ c), x), uniform((3, 3))),
    case(
        "case",
        lambda x, p: lax.cond(p, jnp.sin, jnp.cos, x),
        X34,
        np.bool_(True),
        id="cond-true",
    ),
    case(
        "case",
        lambda x: lax.cond(x.sum() > 100, jnp.sin, jnp.cos, x),
        X34,
        id="cond-false",
    ),
    *[
        case("case", lambda x, i: lax.switch(i, BRANCHES, x), X34, np.int32(i), id=f"switch-{i}")
        for i in (0, 1, 2, 5, -1)  # out-of-range indices are clamped
    ],
    case("optimization_barrier", lambda x, y: lax.optimization_barrier((x * 2, y)), X34, IDX),
    case("sine", lambda x: helper(x) + helper(x * 2.0), X34, id="call-twice"),
    case(
        "sharding_constraint",
        lambda x: (
            jax.lax.with_sharding_constraint(
                x + 1.0, jax.sharding.SingleDeviceSharding(jax.devices()[0])
            )
            * 2.0
        ),
        X34,
    ),
]


# Values only: a loop whose trips only a run knows warns that its cost assumes one trip.
@pytest.mark.filterwarnings("ignore::ipujax.LoopTripsWarning")
@pytest.mark.parametrize("c", params(CONTROL_CASES))
def test_control_flow(c):
    run_case(c)


def test_regions_and_calls_reach_expected_ops():
    """Sanity of the per-case op claims above: the `while` body's ops are walked into."""
    c = case("while", lambda x: lax.fori_loop(0, 2, lambda i, y: lax.erf(y), x), X34)
    names = op_names(run_case(c))
    assert {"while", "erf"} <= names


# Ops jax emits for common programs but the brief's vocabulary may leave out; run when supported.
def _printed(x):
    jax.debug.print("x = {}", x)
    return x * 2


# Library ops (LAPACK custom calls, the FFT, host callbacks); tests/lowering/test_linalg.py,
# test_fft.py and test_debug_print.py test them in depth.
LIBRARY_CASES = [
    case("cholesky", lambda x: jnp.linalg.cholesky(x @ x.T + 3 * jnp.eye(3)), uniform((3, 3))),
    case("lu triangular_solve", lambda x: jnp.linalg.solve(x + 3 * jnp.eye(3), x), uniform((3, 3))),
    case("fft", jnp.fft.rfft, uniform((2, 8))),
    case("host_callback", _printed, uniform((3,))),
]

OPTIONAL_CASES = [
    case(
        "select_and_scatter",
        jax.grad(lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (2, 2), (2, 2), "VALID").sum()),
        uniform((4, 6)),
    ),
    *LIBRARY_CASES,
]


@pytest.mark.parametrize("c", params(OPTIONAL_CASES))
def test_optional_ops(c):
    if not c.ops <= lowering.VOCABULARY:
        pytest.skip(f"{sorted(c.ops)} not in lowering.VOCABULARY")
    run_case(c)


ALL_CASES = [
    *test_ops.UNARY_CASES,
    *test_ops.BINARY_CASES,
    *test_ops.INT_CASES,
    *test_ops.CONVERT_CASES,
    test_ops.NAN_CASE,
    test_ops.COMPLEX_CASE,
    *SHAPE_CASES,
    *CONTRACT_CASES,
    *REDUCE_CASES,
    *INDEX_CASES,
    *CONTROL_CASES,
    *OPTIONAL_CASES,
]


def test_sums_and_maxima_reduce_without_a_traced_region():
    """A region that is one add (max, ...) of its inputs, from the identity, is evaluated as
    jax.lax's own `reduce_sum` (`reduce_max`, ...), not a reduce tracing the region."""

    def fun(x):
        window = lax.reduce_window(x, -jnp.inf, lax.max, (2, 1, 1), (1, 1, 1), "VALID")
        return x.sum(0), x.max(1), window

    graph = lowering.lower(fun, X234)
    jaxpr = jax.make_jaxpr(lambda x: lowering.interpret(graph, (x,)))(X234)
    names = {e.primitive.name for e in jaxpr.eqns}
    assert {"reduce_sum", "reduce_max", "reduce_window_max"} <= names, names
    assert not {"reduce", "reduce_window"} & names, names


def test_cases_exercise_whole_vocabulary():
    """Every op a jax program can lower to is exercised here; the collectives, shard ops and
    fusions, which only the partitioner makes, are exercised by tests/partitioner, and a
    shard_map's (which needs a device per IPU to run under jax.jit) by
    tests/ipujax/test_shard_map.py."""
    seen: set[str] = set()
    for c in ALL_CASES:
        if c.ops <= lowering.VOCABULARY:
            seen |= op_names(lowered(c))
    inserted = COLLECTIVES | SHARD_OPS | FUSIONS | {"manual_computation"}
    assert set(lowering.VOCABULARY) - inserted - seen == set()

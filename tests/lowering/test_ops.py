"""Elementwise ops, differential against jax.jit: float (f32/f16/bf16), integer, bool, conversions.

Every case also asserts that its lowered graph contains the op it is meant to exercise, so a
case cannot silently stop covering its op when jax changes how it lowers a function.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend.core import Primitive
from jax.extend.mlir.dialects import chlo, stablehlo
from jax.interpreters import mlir
from oracle import BF16, FLOAT_DTYPES, bools, case, integers, params, run_case, uniform


def raw_unary(name, emit, result_dtype=None):
    """A primitive whose lowering is exactly one MLIR op, for ops jax itself no longer emits."""
    prim = Primitive(f"raw_{name}")
    prim.def_abstract_eval(lambda a: a if result_dtype is None else a.update(dtype=result_dtype))
    mlir.register_lowering(prim, lambda ctx, x: [emit(x)])
    return prim.bind


# jax lowers lax.logistic to exp/divide, jnp.isinf to abs/compare and conj to real/imag/complex.
raw_logistic = raw_unary("logistic", stablehlo.logistic)
raw_conj = raw_unary("conj", chlo.conj)
raw_is_inf = raw_unary("is_inf", chlo.is_inf, np.bool_)
raw_is_pos_inf = raw_unary("is_pos_inf", chlo.is_pos_inf, np.bool_)
raw_is_neg_inf = raw_unary("is_neg_inf", chlo.is_neg_inf, np.bool_)


def each(op):
    """Apply a unary op to each of several arrays (one per float dtype) in a single program."""
    return lambda *xs: tuple(op(x) for x in xs)


def each2(op):
    """Apply a binary op pairwise: each2(op)(a0, a1, ..., b0, b1, ...) -> (op(a0, b0), ...)."""

    def fn(*xs):
        half = len(xs) // 2
        return tuple(op(a, b) for a, b in zip(xs[:half], xs[half:], strict=True))

    return fn


def per_dtype(shape, lo, hi, seed=0, rounded=False):
    """One array per float dtype, same values (rounded to integers if `rounded`)."""
    x = uniform(shape, lo, hi, np.float32, seed)
    return tuple((np.round(x) if rounded else x).astype(dtype) for dtype in FLOAT_DTYPES)


HALVES = np.array([-2.5, -1.5, -0.5, 0.0, 0.5, 1.5, 2.5, -0.7, 0.3, 3.49], np.float32)

# (op name, function, lo, hi): unary float ops and the input domain that keeps them finite.
UNARY_FLOAT = [
    ("negate", lax.neg, -3, 3),
    ("abs", lax.abs, -3, 3),
    ("floor", lax.floor, -3, 3),
    ("ceil", lax.ceil, -3, 3),
    ("sqrt", lax.sqrt, 0, 4),
    ("rsqrt", lax.rsqrt, 0.1, 4),
    ("cbrt", lax.cbrt, -3, 3),
    ("exponential", lax.exp, -3, 3),
    ("exponential_minus_one", lax.expm1, -3, 3),
    ("log", lax.log, 0.1, 4),
    ("log_plus_one", lax.log1p, -0.9, 3),
    ("logistic", raw_logistic, -4, 4),
    ("tanh", lax.tanh, -3, 3),
    ("sine", lax.sin, -4, 4),
    ("cosine", lax.cos, -4, 4),
    ("tan", lax.tan, -1.2, 1.2),
    ("is_finite", lax.is_finite, -3, 3),
    # chlo ops jax emits
    ("erf", jax.scipy.special.erf, -2, 2),
    ("erf_inv", jax.scipy.special.erfinv, -0.9, 0.9),
    ("erfc", lax.erfc, -2, 2),
    ("lgamma", lax.lgamma, 0.1, 5),
    ("digamma", lax.digamma, 0.5, 5),
    ("sinh", jnp.sinh, -3, 3),
    ("cosh", jnp.cosh, -3, 3),
    ("asin", jnp.arcsin, -0.9, 0.9),
    ("acos", jnp.arccos, -0.9, 0.9),
    ("atan", jnp.arctan, -3, 3),
    ("asinh", jnp.arcsinh, -3, 3),
    ("acosh", jnp.arccosh, 1.1, 4),
    ("atanh", jnp.arctanh, -0.9, 0.9),
    ("square", jnp.square, -3, 3),
    ("bessel_i1e", lax.bessel_i1e, -4, 4),
    ("reduce_precision", lambda x: lax.reduce_precision(x, 4, 3), -3, 3),
]

UNARY_CASES = [
    case(name, each(fn), *per_dtype((3, 5), lo, hi), id=name) for name, fn, lo, hi in UNARY_FLOAT
] + [
    case("sign", each(lax.sign), *(HALVES.astype(d) for d in FLOAT_DTYPES), id="sign"),
    case(
        "round_nearest_afz",
        each(lambda x: lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO)),
        *(HALVES.astype(d) for d in FLOAT_DTYPES),
    ),
    case("round_nearest_even", each(jnp.round), *(HALVES.astype(d) for d in FLOAT_DTYPES)),
    case("erfc", lambda x: jax.nn.gelu(x, approximate=False), uniform((4, 6)), id="gelu-exact"),
]


@pytest.mark.parametrize("c", params(UNARY_CASES))
def test_unary_float(c):
    run_case(c)


def _binary(lo_b=-3.0, hi_b=3.0):
    """a (per dtype) then b (per dtype), with b sharing some elements with a."""
    a = per_dtype((4, 5), -3, 3, seed=1)
    b = per_dtype((4, 5), lo_b, hi_b, seed=2)
    for x, y in zip(a, b, strict=True):
        y[0] = x[0]  # equal elements for compare/max/min ties
    return a + b


BINARY_FLOAT = [
    ("add", lax.add, _binary()),
    ("subtract", lax.sub, _binary()),
    ("multiply", lax.mul, _binary()),
    ("divide", lax.div, per_dtype((4, 5), -3, 3, 1) + per_dtype((4, 5), 0.5, 3, 2)),
    ("remainder", lax.rem, per_dtype((4, 5), -5, 5, 1) + per_dtype((4, 5), 0.5, 2, 2)),
    ("power", lax.pow, per_dtype((4, 5), 0.1, 3, 1) + per_dtype((4, 5), -2, 2, 2)),
    ("maximum", lax.max, _binary()),
    ("minimum", lax.min, _binary()),
    ("atan2", lax.atan2, _binary()),
    ("next_after", lax.nextafter, _binary()),
    (
        "polygamma",
        lax.polygamma,
        per_dtype((4, 5), 0, 2.4, 1, rounded=True) + per_dtype((4, 5), 0.5, 4, 2),
    ),
    ("zeta", lax.zeta, per_dtype((4, 5), 1.5, 5, 1) + per_dtype((4, 5), 0.5, 3, 2)),
]


def all_compares(a, b):
    return (a == b, a != b, a < b, a <= b, a > b, a >= b)


BINARY_CASES = [case(name, each2(fn), *args, id=name) for name, fn, args in BINARY_FLOAT] + [
    case("compare", each2(all_compares), *_binary(), id="compare-float"),
    case(
        "select",
        lambda p, a, b, c, d: (lax.select(p, a, b), jnp.where(p[0], c, d)),
        bools((4, 5)),
        uniform((4, 5)),
        uniform((4, 5), seed=1),
        uniform((5,), dtype=BF16),
        uniform((4, 5), dtype=BF16, seed=3),
    ),
    case(
        "clamp",
        lambda x, lo, hi, y: (lax.clamp(lo, x, hi), lax.clamp(np.float16(-1), y, np.float16(0.5))),
        uniform((4, 5)),
        uniform((4, 5), -3, 0, seed=1),
        uniform((4, 5), 0, 3, seed=2),
        uniform((4, 5), dtype=np.float16),
    ),
]


@pytest.mark.parametrize("c", params(BINARY_CASES))
def test_binary_float(c):
    run_case(c)


INT_DTYPES = (np.int8, np.int32, np.uint8, np.uint32)


def int_operands(dtype, shape=(4, 6)):
    """Full-range a; b nonzero except one zero; includes MIN / -1 for signed types."""
    a = integers(shape, dtype, seed=3)
    b = integers(shape, dtype, seed=4)
    b[b == 0] = 1
    b[0, 0] = 0
    if np.issubdtype(dtype, np.signedinteger):
        a[0, 1], b[0, 1] = np.iinfo(dtype).min, -1
    a[1, :2] = b[1, :2]
    return a, b


def shift_operands(dtype, shape=(4, 6)):
    """Shift amounts 0..bits+2, so out-of-range shifts are covered too."""
    bits = np.iinfo(dtype).bits
    return integers(shape, dtype, seed=5), integers(shape, dtype, lo=0, hi=bits + 2, seed=6)


INT_BINARY = [
    ("add", lax.add),
    ("subtract", lax.sub),
    ("multiply", lax.mul),
    ("divide", lax.div),
    ("remainder", lax.rem),
    ("maximum", lax.max),
    ("minimum", lax.min),
    ("and", lax.bitwise_and),
    ("or", lax.bitwise_or),
    ("xor", lax.bitwise_xor),
    ("compare", all_compares),
]
SHIFTS = [
    ("shift_left", lax.shift_left),
    ("shift_right_arithmetic", lax.shift_right_arithmetic),
    ("shift_right_logical", lax.shift_right_logical),
]
INT_UNARY = [
    ("not", lax.bitwise_not),
    ("negate", lax.neg),
    ("abs", lax.abs),
    ("sign", lax.sign),
    ("popcnt", lax.population_count),
    ("count_leading_zeros", lax.clz),
]


def _int_cases():
    cases = []
    for dtype in INT_DTYPES:
        tag = np.dtype(dtype).name
        a, b = int_operands(dtype)
        for name, fn in INT_BINARY:
            cases.append(case(name, fn, a, b, id=f"{name}-{tag}"))
        for name, fn in SHIFTS:
            cases.append(case(name, fn, *shift_operands(dtype), id=f"{name}-{tag}"))
        for name, fn in INT_UNARY:
            if name in ("negate", "abs", "sign") and not np.issubdtype(dtype, np.signedinteger):
                continue
            cases.append(case(name, fn, a, id=f"{name}-{tag}"))
    p, q = bools((3, 4), seed=1), bools((3, 4), seed=2)
    cases += [
        case("and or xor not", lambda p, q: (p & q, p | q, p ^ q, ~p), p, q, id="logic-bool"),
        case("compare", lambda p, q: (p == q, p != q), p, q, id="compare-bool"),
        case("select", lax.select, p, *int_operands(np.int8, (3, 4)), id="select-int8"),
        case(
            "clamp",
            lambda x: (lax.clamp(np.int32(-5), x, np.int32(7)), jnp.clip(x, -3, 3)),
            integers((3, 4), np.int32, -10, 10),
            id="clamp-int32",
        ),
    ]
    return cases


INT_CASES = _int_cases()


@pytest.mark.parametrize("c", params(INT_CASES))
def test_integer_and_bool(c):
    run_case(c)


def _convert_all(x):
    """f32 -> every other dtype (in range for the integer ones) and back."""
    return (
        x.astype(jnp.int32),
        x.astype(jnp.int8),
        jnp.abs(x).astype(jnp.uint8),
        x.astype(jnp.float16),
        x.astype(jnp.bfloat16),
        x.astype(jnp.bool_),
        x.astype(jnp.bfloat16).astype(jnp.float16),
    )


CONVERT_CASES = [
    case("convert", _convert_all, np.array([-3.7, -0.5, 0.0, 0.2, 2.5, 99.9], np.float32)),
    case(
        "convert",
        lambda i, u, p: (
            i.astype(jnp.float32),
            i.astype(jnp.uint8),
            i.astype(jnp.bfloat16),
            u.astype(jnp.int32),
            u.astype(jnp.float32),
            p.astype(jnp.int32),
            p.astype(jnp.float16),
            i.astype(jnp.bool_),
        ),
        integers((3, 4), np.int32, -1000, 1000),
        integers((3, 4), np.uint32),
        bools((3, 4)),
        id="convert-int",
    ),
    case(
        "bitcast_convert",
        lambda x, u: (
            lax.bitcast_convert_type(x, jnp.int32),
            lax.bitcast_convert_type(x, jnp.uint8),  # f32[3] -> u8[3, 4]
            lax.bitcast_convert_type(u, jnp.float32),  # u8[2, 4] -> f32[2]
            lax.bitcast_convert_type(x.astype(jnp.float16), jnp.int16),
        ),
        uniform((3,)),
        integers((2, 4), np.uint8, 0, 255),
    ),
]


@pytest.mark.parametrize("c", params(CONVERT_CASES))
def test_convert(c):
    run_case(c)


def _nan_program(x, y):
    return (
        x + y,
        jnp.maximum(x, y),
        jnp.minimum(x, y),
        jnp.exp(x),
        jnp.log(x),
        jnp.sqrt(x),
        x / y,
        jnp.isfinite(x / y),
        jnp.sort(x),
        jnp.argmax(x),
        jnp.max(x),
        x == x,
        raw_is_inf(x),
        raw_is_pos_inf(x),
        raw_is_neg_inf(x),
    )


NAN_X = np.array([np.nan, np.inf, -np.inf, 0.0, -1.0, 2.0, -0.0], np.float32)
NAN_Y = np.array([1.0, np.inf, 1.0, 0.0, 0.0, np.nan, -0.0], np.float32)
NAN_CASE = case(
    "add maximum minimum divide is_finite sort is_inf is_pos_inf is_neg_inf",
    _nan_program,
    NAN_X,
    NAN_Y,
    id="nan-inf",
)


def test_nan_and_inf_propagate():
    run_case(NAN_CASE)


def _complex_program(re, im, z):
    w = lax.complex(re, im)
    return (w, raw_conj(w), jnp.conj(z), jnp.real(w * z), jnp.imag(jnp.exp(z)), jnp.abs(z), z / w)


COMPLEX_CASE = case(
    "complex conj real imag multiply exponential abs divide",
    _complex_program,
    uniform((3, 4)),
    uniform((3, 4), 0.5, 3, seed=1),
    (uniform((3, 4), seed=5) + 1j * uniform((3, 4), seed=6)).astype(np.complex64),
    id="complex64",
)


def test_complex():
    run_case(COMPLEX_CASE)

"""Linear algebra and FFTs: the LAPACK custom calls jax emits on CPU, StableHLO's
`triangular_solve` and `fft`, as ops of the IR with their import, shape, evaluation and cost
rules (merged into the shared tables by `lowering.library_ops`; their FLOPs, to which
`cost_rules` adds the bytes).

On CPU, `jnp.linalg.cholesky` calls LAPACK's `potrf` (`lapack_spotrf_ffi` for f32),
`jnp.linalg.solve` calls `getrf` and then `trsm` twice, and `jax.scipy.linalg.solve_triangular`
calls `trsm` (StableHLO's `triangular_solve` for types LAPACK lacks, such as f16). The IR keeps
LAPACK's results as the custom call returns them, and evaluates them with `jax.lax.linalg`, which
runs the same LAPACK kernels on the same operands under `jax.jit` on CPU, so every value the
program reads is `jax.jit`'s bit for bit:

- `cholesky` returns (factor, info). The factor's lower triangle is L, its upper triangle the
  operand's, untouched, as `potrf` leaves it; info is 0 when the factorisation succeeded and
  positive otherwise (jax reads only `info == 0`; LAPACK's positive value, the order of the
  leading minor that failed, is not reproduced: a failed factor is NaN throughout, as jax makes
  it).
- `lu` returns (LU, pivots, info): LAPACK's 1-based row interchanges, and info the 1-based index
  of the first zero pivot, or 0, exactly as `getrf` sets them.
- `triangular_solve` is StableHLO's (and `jax.lax.linalg.triangular_solve`'s) op.
- `fft` is StableHLO's, evaluated by `jax.lax.fft`.

FLOPs are LAPACK's and the FFT's usual counts: Cholesky n^3/3, LU m n^2 - n^3/3 (2 n^3 / 3
square), a triangular solve n^2 per right-hand side, four times as many real FLOPs for complex
elements; an FFT of N points 5 N log2 N (half for a real transform).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax import lax
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from lowering.errors import UnsupportedFeatureError
from lowering.ir import Graph, Value

Array = Any
Aval = jax.ShapeDtypeStruct
Attrs = dict[str, Any]
_I32 = np.dtype(np.int32)

# LAPACK's character arguments, as jax passes them in the custom call's `mhlo.backend_config`.
_LOWER, _UPPER, _LEFT, _NO_TRANSPOSE, _TRANSPOSE, _ADJOINT, _UNIT = (ord(c) for c in "LULNTCU")

# The custom-call targets jax's CPU lowering emits, by the vocabulary name they import as:
# `lapack_<s|d|c|z><routine>_ffi`.
LAPACK_ROUTINES = {"potrf": "cholesky", "getrf": "lu", "trsm": "triangular_solve"}


def lapack_op_name(target: str) -> str | None:
    """The vocabulary name of a LAPACK custom-call target, or None."""
    if not (target.startswith("lapack_") and target.endswith("_ffi")):
        return None
    routine = target[len("lapack_") : -len("_ffi")]
    if len(routine) < 2 or routine[0] not in "sdcz":
        return None
    return LAPACK_ROUTINES.get(routine[1:])


# ---- import ----------------------------------------------------------------------------------


def _backend_config(op: ir.Operation) -> dict[str, int]:
    """The integer attributes jax passes an FFI custom call (`mhlo.backend_config`)."""
    attr = op.attributes.get("mhlo.backend_config")
    if attr is None:
        return {}
    config = ir.DictAttr(attr)
    return {
        named.name: int(ir.IntegerAttr(named.attr).value)
        for named in (config[i] for i in range(len(config)))
    }


def _cholesky_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    if op.name != "stablehlo.custom_call":
        raise UnsupportedFeatureError(
            "StableHLO's cholesky, which jax emits off CPU; ipujax imports LAPACK's potrf, as jax "
            "emits it on CPU"
        )
    if _backend_config(op).get("uplo", _LOWER) != _LOWER:
        raise UnsupportedFeatureError("potrf of the upper triangle; jax factors the lower one")
    return {}


def _lu_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    return {}


def _triangular_solve_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    if op.name == "stablehlo.custom_call":
        config = _backend_config(op)
        trans = config.get("trans_x", _NO_TRANSPOSE)
        return {
            "left_side": config.get("side", _LEFT) == _LEFT,
            "lower": config.get("uplo", _LOWER) == _LOWER,
            "transpose_a": trans != _NO_TRANSPOSE,
            "conjugate_a": trans == _ADJOINT,
            "unit_diagonal": config.get("diag", _UNIT) == _UNIT,
        }
    transpose = stablehlo.TransposeAttr(op.attributes["transpose_a"]).value
    return {
        "left_side": bool(ir.BoolAttr(op.attributes["left_side"]).value),
        "lower": bool(ir.BoolAttr(op.attributes["lower"]).value),
        "transpose_a": transpose != "NO_TRANSPOSE",
        "conjugate_a": transpose == "ADJOINT",
        "unit_diagonal": bool(ir.BoolAttr(op.attributes["unit_diagonal"]).value),
    }


def _fft_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    lengths = ir.DenseI64ArrayAttr(op.attributes["fft_length"])
    return {
        "fft_type": stablehlo.FftTypeAttr(op.attributes["fft_type"]).value,
        "fft_lengths": tuple(int(n) for n in lengths),
    }


# ---- shapes ----------------------------------------------------------------------------------


def _cholesky_shape_rule(x: Aval) -> tuple[Aval, ...]:
    return (Aval(x.shape, x.dtype), Aval(x.shape[:-2], _I32))


def _lu_shape_rule(x: Aval) -> tuple[Aval, ...]:
    *batch, m, n = x.shape
    return (Aval(x.shape, x.dtype), Aval((*batch, min(m, n)), _I32), Aval(tuple(batch), _I32))


def _triangular_solve_shape_rule(a: Aval, b: Aval, **attrs: Any) -> tuple[Aval, ...]:
    return (Aval(b.shape, b.dtype),)


def _complex_of(dtype: Any) -> np.dtype:
    return np.result_type(dtype, np.complex64)


def _real_of(dtype: Any) -> np.dtype:
    return np.finfo(np.dtype(dtype)).dtype


def _fft_shape_rule(x: Aval, *, fft_type: str, fft_lengths: tuple[int, ...]) -> tuple[Aval, ...]:
    if fft_type == "RFFT":
        return (Aval((*x.shape[:-1], fft_lengths[-1] // 2 + 1), _complex_of(x.dtype)),)
    if fft_type == "IRFFT":
        return (Aval((*x.shape[:-1], fft_lengths[-1]), _real_of(x.dtype)),)
    return (Aval(x.shape, x.dtype),)


# ---- evaluation ------------------------------------------------------------------------------


def _diagonal(x: Array) -> Array:
    return jax.numpy.diagonal(x, axis1=-2, axis2=-1)


def _first_index_plus_one(flags: Array) -> Array:
    """Per matrix, 1 + the index of the first true flag on its diagonal, or 0 when none is."""
    if flags.shape[-1] == 0:
        return jax.numpy.zeros(flags.shape[:-1], _I32)
    first = jax.numpy.argmax(flags, axis=-1).astype(_I32) + 1
    return jax.numpy.where(flags.any(axis=-1), first, 0).astype(_I32)


def _cholesky_eval_rule(x: Array) -> tuple[Array, ...]:
    factor = lax.linalg.cholesky(x, symmetrize_input=False)
    n = x.shape[-1]
    below = lax.broadcasted_iota(_I32, (n, n), 0) >= lax.broadcasted_iota(_I32, (n, n), 1)
    raw = jax.numpy.where(below, factor, x)
    failed = jax.numpy.isnan(_diagonal(factor))
    return raw, _first_index_plus_one(failed)


def _lu_eval_rule(x: Array) -> tuple[Array, ...]:
    lu, pivots, _ = lax.linalg.lu(x)
    zero_pivot = _diagonal(lu) == 0
    return lu, (pivots + 1).astype(_I32), _first_index_plus_one(zero_pivot)


def _triangular_solve_eval_rule(a: Array, b: Array, **attrs: bool) -> tuple[Array, ...]:
    return (lax.linalg.triangular_solve(a, b, **attrs),)


def _fft_eval_rule(x: Array, *, fft_type: str, fft_lengths: tuple[int, ...]) -> tuple[Array, ...]:
    return (lax.fft(x, lax.FftType[fft_type], fft_lengths),)


# ---- cost ------------------------------------------------------------------------------------


def _scale(value: Value) -> int:
    """Real FLOPs per FLOP of the routine: a complex multiply-add is four real ones."""
    return 4 if np.issubdtype(value.dtype, np.complexfloating) else 1


def _matrices(value: Value) -> int:
    return math.prod(value.shape[:-2])


def cholesky_flops(n: int) -> int:
    """LAPACK's potrf: n^3/3 + n^2/2 + n/6 FLOPs (LAWN 41), of which n^3/3 dominates."""
    return (2 * n**3 + 3 * n**2 + n) // 6


def lu_flops(m: int, n: int) -> int:
    """LAPACK's getrf of an m x n matrix: m n^2 - n^3/3 FLOPs for m >= n (LAWN 41); 2 n^3/3
    square."""
    small, large = min(m, n), max(m, n)
    return large * small * small - small**3 // 3


def triangular_solve_flops(n: int, rhs: int) -> int:
    """trsm: n^2 FLOPs per right-hand side (a multiply and an add per element below the
    diagonal, a divide per diagonal element)."""
    return n * n * rhs


def fft_flops(points: int, real: bool) -> int:
    """5 N log2 N FLOPs per complex transform of N points (the radix-2 count); a real
    transform half of that."""
    if points <= 1:
        return 0
    flops = 5 * points * math.log2(points)
    return math.ceil(flops / 2 if real else flops)


def _cholesky_flops_rule(operands: tuple[Value, ...], results: tuple[Value, ...]) -> int:
    (x,) = operands
    return _matrices(x) * cholesky_flops(x.shape[-1]) * _scale(x)


def _lu_flops_rule(operands: tuple[Value, ...], results: tuple[Value, ...]) -> int:
    (x,) = operands
    return _matrices(x) * lu_flops(x.shape[-2], x.shape[-1]) * _scale(x)


def _triangular_solve_flops_rule(
    operands: tuple[Value, ...], results: tuple[Value, ...], *, left_side: bool, **attrs: Any
) -> int:
    a, b = operands
    rhs = b.shape[-1] if left_side else b.shape[-2]
    return _matrices(b) * triangular_solve_flops(a.shape[-1], rhs) * _scale(a)


def fft_points(fft_lengths: tuple[int, ...]) -> int:
    return math.prod(fft_lengths)


def fft_transforms(signal: Value, fft_lengths: tuple[int, ...]) -> int:
    """How many transforms an FFT of `signal` (its complex side) runs: its leading dims."""
    return math.prod(signal.shape[: len(signal.shape) - len(fft_lengths)])


def _fft_flops_rule(
    operands: tuple[Value, ...],
    results: tuple[Value, ...],
    *,
    fft_type: str,
    fft_lengths: tuple[int, ...],
) -> int:
    real = fft_type in ("RFFT", "IRFFT")
    transforms = fft_transforms(operands[0], fft_lengths)
    return transforms * fft_flops(fft_points(fft_lengths), real)


Rule = Callable[..., Any]
LINALG_IMPORT_RULES: dict[str, Rule] = {
    "cholesky": _cholesky_import_rule,
    "lu": _lu_import_rule,
    "triangular_solve": _triangular_solve_import_rule,
    "fft": _fft_import_rule,
}
LINALG_SHAPE_RULES: dict[str, Rule] = {
    "cholesky": _cholesky_shape_rule,
    "lu": _lu_shape_rule,
    "triangular_solve": _triangular_solve_shape_rule,
    "fft": _fft_shape_rule,
}
LINALG_EVAL_RULES: dict[str, Rule] = {
    "cholesky": _cholesky_eval_rule,
    "lu": _lu_eval_rule,
    "triangular_solve": _triangular_solve_eval_rule,
    "fft": _fft_eval_rule,
}
# FLOPs per op; `cost_rules` adds the bytes every op reads and writes.
LINALG_FLOPS: dict[str, Rule] = {
    "cholesky": _cholesky_flops_rule,
    "lu": _lu_flops_rule,
    "triangular_solve": _triangular_solve_flops_rule,
    "fft": _fft_flops_rule,
}

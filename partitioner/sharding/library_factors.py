"""Factor rules of the library ops (`lowering.library_ops`): linear algebra and FFTs split over
IPUs by the dims they do not transform (a batch of matrices, the right-hand sides of a solve,
the signals of an FFT); the matrix and transformed dims stay whole on each IPU. A host callback
runs on the whole of its operands, as `jax.jit` hands them to the host: gathered first."""

from __future__ import annotations

from lowering import Op
from partitioner.sharding.factors import Dims, FactorRule, Factors


def _leading(rank: int, whole: int) -> Dims:
    """The first `rank - whole` dims as factors 0, 1, ...; the last `whole` dims whole."""
    return tuple(d if d < rank - whole else None for d in range(rank))


def _batched_factor_rule(op: Op) -> Factors:
    """Cholesky and LU: the batch dims of the matrix and of every result (the factor; LU's
    pivots; info) correspond; the matrix dims are whole."""
    (x,) = op.operands
    batch = len(x.shape) - 2
    results = tuple(_leading(len(r.shape), len(r.shape) - batch) for r in op.results)
    return Factors((_leading(len(x.shape), 2),), results, x.shape[:batch], rule="linalg")


def _triangular_solve_factor_rule(op: Op) -> Factors:
    """The batch dims correspond; so do the right-hand sides of `b` and of the result (its
    columns when `a` is on the left, else its rows), each solved on its own."""
    a, b = op.operands
    batch = len(a.shape) - 2
    rhs_dim = len(b.shape) - 1 if op.attrs["left_side"] else len(b.shape) - 2
    b_dims = tuple(d if d < batch else batch if d == rhs_dim else None for d in range(len(b.shape)))
    sizes = (*a.shape[:batch], b.shape[rhs_dim])
    return Factors((_leading(len(a.shape), 2), b_dims), (b_dims,), sizes, rule="linalg")


def _fft_factor_rule(op: Op) -> Factors:
    """The signals (the dims before the transformed ones) split freely."""
    transformed = len(op.attrs["fft_lengths"])
    (x,) = op.operands
    dims = _leading(len(x.shape), transformed)
    sizes = x.shape[: len(x.shape) - transformed]
    return Factors((dims,), (_leading(len(op.results[0].shape), transformed),), sizes, rule="fft")


def _host_callback_factor_rule(op: Op) -> Factors:
    return Factors(
        tuple((None,) * len(v.shape) for v in op.operands),
        tuple((None,) * len(v.shape) for v in op.results),
        (),
        rule="replicated",
    )


LIBRARY_FACTOR_RULES: dict[str, FactorRule] = {
    "cholesky": _batched_factor_rule,
    "lu": _batched_factor_rule,
    "triangular_solve": _triangular_solve_factor_rule,
    "fft": _fft_factor_rule,
    "host_callback": _host_callback_factor_rule,
}

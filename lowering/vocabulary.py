"""The closed op vocabulary: every op the IR knows, grouped by how it behaves.

Names are StableHLO's (and CHLO's) without the dialect prefix. Each per-op table (import, shape,
evaluation, cost) must cover exactly this set; a test checks it. An op outside it is an
`UnsupportedOpError` at import time.
"""

from __future__ import annotations

import functools

# Elementwise ops of one operand whose result has the operand's type.
UNARY = frozenset(
    {
        "abs", "cbrt", "ceil", "count_leading_zeros", "cosine", "exponential",
        "exponential_minus_one", "floor", "log", "log_plus_one", "logistic", "negate", "not",
        "popcnt", "round_nearest_afz", "round_nearest_even", "rsqrt", "sign", "sine", "sqrt",
        "tan", "tanh", "reduce_precision",
        # CHLO ops jax emits for special functions and inverse trigonometry.
        "acos", "acosh", "asin", "asinh", "atan", "atanh", "bessel_i1e", "conj", "cosh",
        "digamma", "erf", "erf_inv", "erfc", "lgamma", "sinh", "square",
    }
)  # fmt: skip

# Elementwise ops of one operand whose result type differs from the operand's.
UNARY_TYPED = frozenset(
    {"convert", "bitcast_convert", "is_finite", "is_inf", "is_neg_inf", "is_pos_inf", "real",
     "imag"}
)  # fmt: skip

# Elementwise ops of two operands of one type.
BINARY = frozenset(
    {
        "add", "subtract", "multiply", "divide", "remainder", "power", "maximum", "minimum",
        "atan2", "and", "or", "xor", "shift_left", "shift_right_arithmetic",
        "shift_right_logical", "next_after", "polygamma", "zeta",
    }
)  # fmt: skip

# Elementwise ops with a result type of their own or three operands.
ELEMENTWISE_OTHER = frozenset({"compare", "complex", "select", "clamp"})

# Ops that make a value from attributes alone.
SOURCES = frozenset({"constant", "iota"})

# Ops that move data without arithmetic.
DATA_MOVEMENT = frozenset(
    {
        "broadcast_in_dim", "reshape", "transpose", "slice", "dynamic_slice",
        "dynamic_update_slice", "concatenate", "pad", "reverse", "gather",
    }
)  # fmt: skip

# Contractions: the ops PopLibs plans as (1x1) convolutions.
CONTRACTIONS = frozenset({"dot_general", "convolution"})

# Ops with a region or a combining rule.
STRUCTURED = frozenset(
    {"reduce", "reduce_window", "scatter", "select_and_scatter", "sort", "top_k"}
)

# Control flow and annotations.
CONTROL = frozenset(
    {"while", "case", "optimization_barrier", "sharding_constraint", "manual_computation"}
)

# Ops over the IPUs of a mesh axis, which the partitioner inserts into the per-IPU program:
# the collectives, and taking, masking or indexing this IPU's shard of a dimension, or
# extending it with its neighbours' edge rows (`halo_exchange`, for ops that read the dimension
# at an offset: a stencil's shifted slices, a pad, a roll). A shard_map's body writes
# collectives itself, and asks for its IPU's place (`partition_id`): `lowering.manual`.
COLLECTIVES = frozenset(
    {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute"}
)
SHARD_OPS = frozenset({"shard_slice", "shard_mask", "shard_index", "halo_exchange", "partition_id"})

# Linear algebra as jax calls LAPACK on CPU (potrf, getrf, trsm custom calls, and StableHLO's
# triangular_solve), and StableHLO's FFT: library routines the IPU runs as PopLibs-style kernels.
LINALG = frozenset({"cholesky", "lu", "triangular_solve"})
SPECTRAL = frozenset({"fft"})

# Host callbacks (jax.debug.print, jax.pure_callback, io_callback): Python run on the host
# mid-step. The only ops with side effects: kept when nothing reads their results.
CALLBACKS = frozenset({"host_callback"})
SIDE_EFFECTS = CALLBACKS

ELEMENTWISE = UNARY | UNARY_TYPED | BINARY | ELEMENTWISE_OTHER

# Ops ipujax makes from others for the machine, never imported: a chain of elementwise ops
# fused into one kernel (`lowering.fusion`), as XLA and Poplar's map expressions run them.
FUSIONS = frozenset({"fusion"})

VOCABULARY: frozenset[str] = (
    ELEMENTWISE
    | SOURCES
    | DATA_MOVEMENT
    | CONTRACTIONS
    | STRUCTURED
    | LINALG
    | SPECTRAL
    | CALLBACKS
    | CONTROL
    | COLLECTIVES
    | SHARD_OPS
    | FUSIONS
)

# Transcendental ops: costed at the IPU's slower special-function rate, not one FLOP per element.
TRANSCENDENTAL = frozenset(
    {
        "cbrt", "cosine", "exponential", "exponential_minus_one", "log", "log_plus_one",
        "logistic", "rsqrt", "sine", "sqrt", "tan", "tanh", "acos", "acosh", "asin", "asinh",
        "atan", "atanh", "bessel_i1e", "cosh", "digamma", "erf", "erf_inv", "erfc", "lgamma",
        "sinh", "power", "atan2", "polygamma", "zeta",
    }
)  # fmt: skip

_DIALECTS = ("stablehlo.", "chlo.", "sdy.")


@functools.cache
def ir_name(mlir_name: str) -> str | None:
    """The vocabulary name of an MLIR op name, or None when the op is outside the vocabulary.
    Kept per name: the importer asks once per op (GPT-3: 100,000 times, of a few dozen)."""
    for prefix in _DIALECTS:
        if mlir_name.startswith(prefix):
            name = mlir_name[len(prefix) :]
            return name if name in VOCABULARY else None
    return None

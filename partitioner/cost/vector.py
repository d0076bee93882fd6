"""Vector work on one tile, as PopLibs' codelet estimators charge it (docs/target.md, "Compute").

An elementwise op on a tile is one of popops' vertices, run by all six workers: `UnaryOp1D`,
`BinaryOp1D`, `Cast1D`, or the `Select` and `Clamp` vertices, one per worker. Each costs a fixed
prologue plus an inner loop whose cycles per loop come from PopLibs' measured tables
(`lib/popops/popopsCycleEstimators.hpp`): `Rate(cycles, natural, unroll)` is their
`OpPerformanceInfo`, a loop over one natural 64-bit vector (2 floats, 4 halves) plus a loop
overhead, or over `unroll` elements in exactly `cycles`. The formulas are the estimators' in
`lib/popops/popopsCycleEstimators.cpp` and `PerformanceEstimation.cpp`; workers run in a barrel,
so a tile's cycles are six times the busiest worker's.

`VECTOR_OPS` names, for every elementwise op of the vocabulary, the PopLibs op that runs it, or
the ops an op PopLibs lacks is built from (an inverse hyperbolic function from a log, a square
root and arithmetic, as XLA expands it); a test checks it covers every op. Reductions use the
reduce vertices' estimators (`lib/popops/reduction/CycleEstimationFunctions.cpp`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from partitioner.target import Target


@dataclass(frozen=True, slots=True)
class Rate:
    """PopLibs' `OpPerformanceInfo`: thread cycles per loop of the inner loop, which handles one
    natural vector (`natural`, plus a loop overhead) or `unroll` elements (0: one element, plus
    the overhead)."""

    cycles: int
    natural: bool = False
    unroll: int = 0


@dataclass(frozen=True, slots=True)
class VectorOp:
    """How an op runs on a tile: its vertex `kind` and rates for float, half and integer (or
    bool) elements; `parts` lists the ops a composite op is built from."""

    kind: str  # unary | binary | select | clamp | cast | view | composite
    float: Rate | None = None
    half: Rate | None = None
    int: Rate | None = None
    parts: tuple[str, ...] = ()
    assembly: bool = False  # PopLibs has an assembly codelet (a shorter loop overhead)


def _u(f: Rate | None, h: Rate | None, i: Rate | None = None) -> VectorOp:
    return VectorOp("unary", f, h, i)


def _b(f: Rate | None, h: Rate | None, i: Rate | None = None, fast: bool = False) -> VectorOp:
    return VectorOp("binary", f, h, i, assembly=fast)


def _c(*parts: str) -> VectorOp:
    return VectorOp("composite", parts=parts)


_INT7 = Rate(7, False, 1)  # PopLibs' integer binary ops: 7 cycles per element
_COMPARE = _b(Rate(14, False, 4), Rate(9, False, 4), Rate(22, False, 4))

# Rates from `unaryOpPerfInfo` and `binaryOpPerfInfo` (popopsCycleEstimators.hpp), by the
# PopLibs op named in the comment; composites as XLA expands them (A: docs/target.md).
VECTOR_OPS: dict[str, VectorOp] = {
    # unary, PopLibs op of the same meaning
    "abs": _u(Rate(1), Rate(1), Rate(2)),  # ABSOLUTE
    "asin": _u(Rate(102), Rate(102)),  # ASIN
    "cbrt": _u(Rate(27, True), Rate(17, True)),  # CBRT
    "ceil": _u(Rate(2, True), Rate(2, True)),  # CEIL
    "cosine": _u(Rate(2300), Rate(25, False, 1)),  # COS
    "count_leading_zeros": _u(None, None, Rate(1)),  # COUNT_LEADING_ZEROS
    "erf": _u(Rate(41, False, 1), Rate(13, False, 1)),  # ERF
    "exponential": _u(Rate(6, False, 2), Rate(4, False, 4)),  # EXPONENT
    "exponential_minus_one": _u(Rate(4), Rate(5, True)),  # EXPONENT_MINUS_ONE
    "floor": _u(Rate(2, True), Rate(2, True)),  # FLOOR
    "is_finite": _u(Rate(5, True), Rate(5, True)),  # IS_FINITE
    "is_inf": _u(Rate(3, True), Rate(5, True)),  # IS_INF
    "is_neg_inf": _u(Rate(3, True), Rate(5, True)),  # IS_INF
    "is_pos_inf": _u(Rate(3, True), Rate(5, True)),  # IS_INF
    "log": _u(Rate(12, False, 2), Rate(4, False, 4)),  # LOGARITHM
    "log_plus_one": _u(Rate(18, True), Rate(18, True)),  # LOGARITHM_ONE_PLUS
    "logistic": _u(Rate(12, False, 2), Rate(6, False, 4)),  # SIGMOID
    "negate": _u(Rate(2, False, 2), Rate(2, False, 4), Rate(2)),  # NEGATE
    "not": _u(None, None, Rate(1, True)),  # BITWISE_NOT (LOGICAL_NOT on bools: 17)
    "popcnt": _u(None, None, Rate(1)),  # POPCOUNT
    "round_nearest_afz": _u(Rate(2, True), Rate(2, True)),  # ROUND
    "round_nearest_even": _u(Rate(2, True), Rate(2, True)),  # NEARBY_INT
    "rsqrt": _u(Rate(8, False, 2), Rate(19, False, 4)),  # RSQRT
    "sign": _u(Rate(5, True), Rate(5, True), Rate(5)),  # SIGNUM
    "sine": _u(Rate(2300), Rate(25, False, 1)),  # SIN
    "sqrt": _u(Rate(10, False, 2), Rate(23, False, 4), Rate(110)),  # SQRT
    "square": _u(Rate(2, False, 2), Rate(2, False, 4), Rate(1, True)),  # SQUARE
    "tan": _u(Rate(5100, False, 1), Rate(5700, False, 1)),  # TAN
    "tanh": _u(Rate(12, False, 2), Rate(4, False, 4)),  # TANH
    # binary, PopLibs op of the same meaning
    "add": _b(Rate(1, True), Rate(1, True), _INT7, fast=True),  # ADD
    "subtract": _b(Rate(1, True), Rate(1, True), _INT7, fast=True),  # SUBTRACT
    "multiply": _b(Rate(1, True), Rate(1, True), _INT7, fast=True),  # MULTIPLY
    "divide": _b(Rate(10, False, 2), Rate(21, False, 4), Rate(277, False, 1)),  # DIVIDE
    "remainder": _b(Rate(133, False, 2), Rate(300, False, 4), Rate(292, False, 1)),  # REMAINDER
    "power": _b(Rate(312, False, 1), Rate(325, False, 1), Rate(32, False, 1)),  # POWER
    "maximum": _b(Rate(3, False, 2), Rate(4, False, 4), _INT7),  # MAXIMUM
    "minimum": _b(Rate(3, False, 2), Rate(4, False, 4), _INT7),  # MINIMUM
    "atan2": _b(Rate(272, False, 2), Rate(578, False, 4)),  # ATAN2
    "and": _b(None, None, _INT7),  # BITWISE_AND (LOGICAL_AND on bools)
    "or": _b(None, None, _INT7),  # BITWISE_OR
    "xor": _b(None, None, _INT7),  # BITWISE_XOR
    "shift_left": _b(None, None, _INT7),  # SHIFT_LEFT
    "shift_right_arithmetic": _b(None, None, _INT7),  # SHIFT_RIGHT_SIGN_EXTEND
    "shift_right_logical": _b(None, None, _INT7),  # SHIFT_RIGHT
    "compare": _COMPARE,  # LESS_THAN and the rest (NOT_EQUAL: 20 / 11, see `_compare`)
    # three operands, and casts
    "select": VectorOp("select"),
    "clamp": VectorOp("clamp"),
    "convert": VectorOp("cast"),
    # reinterpretations: views of the operand in Poplar, no vertex
    "bitcast_convert": VectorOp("view"),
    # ops PopLibs lacks, as XLA builds them from simpler ones (A)
    "acos": _c("asin", "subtract"),
    "atan": _c("atan2"),
    "acosh": _c("multiply", "subtract", "sqrt", "add", "log"),
    "asinh": _c("multiply", "add", "sqrt", "add", "log"),
    "atanh": _c("add", "subtract", "divide", "log", "multiply"),
    "cosh": _c("exponential", "exponential", "add", "multiply"),
    "sinh": _c("exponential", "exponential", "subtract", "multiply"),
    "erfc": _c("erf", "subtract"),
    "erf_inv": _c("log", "sqrt", *("multiply", "add") * 9),
    "lgamma": _c("log", "log", *("divide", "add") * 8, "multiply", "add"),
    "digamma": _c("log", *("divide", "add") * 9, "subtract"),
    "polygamma": _c("power", *("divide", "add") * 9, "multiply"),
    "zeta": _c("power", *("power", "add") * 9, "divide"),
    "bessel_i1e": _c("exponential", "sqrt", *("multiply", "add") * 12),
    "next_after": _c("compare", "add", "select"),
    "reduce_precision": _c("shift_right_logical", "and", "add", "and"),
    # complex numbers: the IPU has none; their parts are charged as float copies (A)
    "real": _c("negate"),
    "imag": _c("negate"),
    "conj": _c("negate"),
    "complex": _c("negate", "negate"),
}


def element_class(dtype: np.dtype) -> str:
    dtype = np.dtype(dtype)
    if dtype.kind == "f" or dtype.kind == "V":  # V: bfloat16 and friends
        return "half" if dtype.itemsize <= 2 else "float"
    if dtype.kind == "c":
        return "float"
    return "int"


def vector_width(target: Target, dtype: np.dtype) -> int:
    """Elements in one natural vector of the 64-bit data path: 2 floats, 4 halves."""
    return max(1, target.vector_bytes_per_cycle // max(1, np.dtype(dtype).itemsize))


def op_rate(op: VectorOp, dtype: np.dtype) -> Rate:
    """The op's rate for `dtype`; an op without one for that type (an integer op on floats,
    say) takes another type's, the most expensive."""
    rates = {"float": op.float, "half": op.half, "int": op.int}
    found = rates[element_class(dtype)]
    if found is not None:
        return found
    return max((r for r in rates.values() if r is not None), key=lambda r: r.cycles)


def _per_worker(elements: int, target: Target) -> int:
    return math.ceil(elements / target.threads_per_tile)


def _loops(m: int, rate: Rate, width: int, overhead: int) -> int:
    """Cycles of a unary inner loop over `m` elements of one worker: unrolled loops of
    `unroll` elements, else PopLibs' `basicOpLoopCycles`, (cycles + overhead) per vector with
    the partial vector's share rounded down, `c (m + w - 1) / w`."""
    if not rate.natural and rate.unroll:
        return math.ceil(m / rate.unroll) * rate.cycles
    step = width if rate.natural else 1
    return (rate.cycles + overhead) * (m + step - 1) // step


def unary_cycles(name: str, elements: int, dtype: np.dtype, target: Target) -> int:
    """`UnaryOp1D`: 6 x (17, or 33 for exp, + inner loop) + 9 + 11 supervisor cycles."""
    rate = op_rate(VECTOR_OPS[name], dtype)
    m = _per_worker(elements, target)
    prologue = 33 if name == "exponential" else 17
    inner = _loops(m, rate, vector_width(target, dtype), 4)
    return target.threads_per_tile * (prologue + inner) + 9 + 11


def binary_cycles(
    name: str, elements: int, dtype: np.dtype, target: Target, in_place: bool = False
) -> int:
    """`BinaryOp1D`: 6 x (29 for floats, else 26, + inner loop) + 11 supervisor cycles; a loop
    overhead of 2 with an assembly codelet, else 5. In place (`BinaryOp1DInPlace`, how a
    matmul adds each serial chunk into its partials) the worker prologue is 58
    (`getBinaryOp1DInPlaceEstimate`)."""
    op = VECTOR_OPS[name]
    rate = op_rate(op, dtype)
    m = _per_worker(elements, target)
    prologue = 58 if in_place else 29 if element_class(dtype) == "float" else 26
    overhead = 2 if op.assembly and element_class(dtype) != "int" else 5
    # PopLibs' `binaryOpInnerLoopCycles`: whole loops of a natural vector or `unroll` elements
    per_loop = vector_width(target, dtype) if rate.natural else max(1, rate.unroll)
    cycles = rate.cycles + (overhead if rate.natural else 0)
    inner = math.ceil(m / per_loop) * cycles
    return target.threads_per_tile * (prologue + inner) + 11


def prologue_cycles(target: Target) -> int:
    """The fixed part of a float `BinaryOp1D`, what an optimizer's update pays however few
    elements a tile holds."""
    return binary_cycles("add", 0, np.dtype(np.float32), target)


def compare_cost(direction: str, dtype: np.dtype) -> int:
    """NOT_EQUAL is slower than the other comparisons: 20 (float) and 11 (half) per 4."""
    if direction == "NE":
        return {"float": 20, "half": 11, "int": 22}[element_class(dtype)]
    return op_rate(_COMPARE, dtype).cycles


def compare_cycles(direction: str, elements: int, dtype: np.dtype, target: Target) -> int:
    m = _per_worker(elements, target)
    prologue = 29 if element_class(dtype) == "float" else 26
    inner = math.ceil(m / 4) * compare_cost(direction, dtype)
    return target.threads_per_tile * (prologue + inner) + 11


def select_cycles(elements: int, target: Target) -> int:
    """`Select`, one vertex per worker: 5 + 6 + 5 cycles per element (load three, move, store)."""
    return target.threads_per_tile * (5 + 6 + 5 * _per_worker(elements, target))


def clamp_cycles(elements: int, dtype: np.dtype, target: Target) -> int:
    """`Clamp`, one vertex per worker: 5 + 6 + 2 cycles per natural vector (7 per integer)."""
    m = _per_worker(elements, target)
    width = 1 if element_class(dtype) == "int" else vector_width(target, dtype)
    per_vector = 7 if width == 1 else 2  # integers: load three, compare twice, move, store
    inner = per_vector * (m + width - 1) // width  # `basicOpLoopCycles`
    return target.threads_per_tile * (5 + 6 + inner)


def _cast_worker(elements: int, source: np.dtype, dest: np.dtype, target: Target) -> int:
    """PopLibs' `castWorkerCycles`: float <-> half on the auxiliary pipeline, as wide as two
    64-bit loads and one 64-bit store allow; other casts one element per two cycles."""
    load = vector_width(target, source)
    store = vector_width(target, dest)
    aux = element_class(source) != "int" and element_class(dest) != "int"
    width = min(2 * load, store) if aux else 1
    per_vector = max(width // min(width, load), width // min(width, store)) + (0 if aux else 1)
    remainder = elements % width
    bits = max(0, math.ceil(math.log2(width))) if width > 1 else 0
    tail = sum(1 + (2 if remainder & (1 << i) else 0) for i in range(bits))
    return 19 + per_vector * (elements // width) + tail


def cast_cycles(elements: int, source: np.dtype, dest: np.dtype, target: Target) -> int:
    """`Cast1D`: 12 + 6 x (the worker's cast + 18)."""
    m = _per_worker(elements, target)
    return 12 + target.threads_per_tile * (_cast_worker(m, source, dest, target) + 18)


def elementwise_cycles(
    name: str,
    elements: int,
    operand: np.dtype,
    result: np.dtype,
    target: Target,
    direction: str = "",
) -> int:
    """One tile's cycles for an elementwise op over `elements` elements of its block."""
    if elements <= 0:
        return 0
    op = VECTOR_OPS[name]
    if op.kind == "view":
        return 0
    if op.kind == "cast":
        if np.dtype(operand) == np.dtype(result):
            return 0
        return cast_cycles(elements, operand, result, target)
    if op.kind == "select":
        return select_cycles(elements, target)
    if op.kind == "clamp":
        return clamp_cycles(elements, operand, target)
    if op.kind == "composite":
        return sum(
            elementwise_cycles(p, elements, operand, operand, target, "LT") for p in op.parts
        )
    if name == "compare":
        return compare_cycles(direction, elements, operand, target)
    if op.kind == "unary":
        return unary_cycles(name, elements, operand, target)
    return binary_cycles(name, elements, operand, target)


# Cached: a model's repeated layers ask for the same reductions thousands of times.
@functools.lru_cache(maxsize=65536)
def reduce_cycles(
    outputs: int, depth: int, dtype: np.dtype, contiguous: bool, operands: int, target: Target
) -> int:
    """A tile reducing `depth` partials into each of `outputs` outputs, split over the workers.

    Contiguous partials (the reduced elements innermost) take PopLibs'
    `ReduceAllRegionsContinuous`: one accumulator vector (4 floats, 8 halves) of partials per
    cycle, limited to 64 bits a cycle, plus 12 per output and 17 per call. Strided partials
    (the kept elements innermost) take `StridedReduce`: per 64 bits of outputs, 6 + one
    cycle per partial (5 more, 8 for halves, to finish each loop). A variadic reduce (an
    argmax) repeats the work for each operand (A).
    """
    if outputs <= 0 or depth <= 0:
        return 0
    workers = target.threads_per_tile
    width = min(_accumulator_width(dtype), vector_width(target, _partials(dtype)))
    if contiguous:
        per_worker = _per_worker(outputs, target)
        # few outputs: the workers split each output's partials and add them up after
        split = max(1, workers // outputs)
        run = math.ceil(depth / split)
        cycles = per_worker * (math.ceil(run / width) + 12) + 17 + (2 if run % 2 else 0)
        if split > 1:
            cycles += 12 + split
    else:  # `StridedReduce`: 16 cycles, then per 64 bits of outputs 3 + post + 3 + P - 1
        per_worker = _per_worker(outputs, target)
        post = 5 if element_class(dtype) != "half" else 8  # finish the loop and store (ADD)
        cycles = 16 + math.ceil(per_worker / width) * (3 + post + 3 + depth - 1)
    return workers * cycles * max(1, operands)


def _partials(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float16) if element_class(dtype) == "half" else np.dtype(np.float32)


def _accumulator_width(dtype: np.dtype) -> int:
    """PopLibs' accumulators: 8 halves or 4 floats (`getAccVectorWidth`); integers one."""
    return {"half": 8, "float": 4, "int": 1}[element_class(dtype)]

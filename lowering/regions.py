"""Reading the meaning of small regions: scatter combiners and sort comparators.

jax.lax can run a reduce or reduce_window with any region, but its scatter takes one of a few
combiners and its sort takes lexicographic keys. jax only ever emits those forms, so the importer
recognises them here and names them; any other region is an unsupported form of the op.
"""

from __future__ import annotations

from lowering.errors import UnsupportedFeatureError
from lowering.ir import Graph, Value, producers

# Scatter regions of the form `return op(current, update)`, by the op's name.
_SCATTER_COMBINERS = {
    "add": "add",
    "multiply": "mul",
    "minimum": "min",
    "maximum": "max",
    "or": "max",  # jax scatters booleans with `or` for max
    "and": "min",
}


def binary_op(region: Graph) -> str | None:
    """The op's name when a region of two inputs returns one op applied to both (`add` for a
    sum, `maximum` for a max...), else None."""
    if len(region.ops) != 1 or len(region.inputs) != 2:
        return None
    (op,) = region.ops
    if set(op.operands) != set(region.inputs) or region.outputs != op.results:
        return None
    return op.name


# Compare directions jax's sort comparators use: a strict "less than" and ties via equality.
_SORT_DIRECTIONS = frozenset({"LT", "EQ", "NE"})


def scatter_combiner(region: Graph) -> str:
    """The combiner of a scatter region: "set" when it returns the update, else an op name."""
    if len(region.inputs) != 2 or len(region.outputs) != 1:
        raise UnsupportedFeatureError("a scatter of several operands")
    current, update = region.inputs
    (out,) = region.outputs
    if out == update:
        return "set"
    body = [op for op in region.ops if out in op.results]
    if body and body[0].name in _SCATTER_COMBINERS and set(body[0].operands) == {current, update}:
        return _SCATTER_COMBINERS[body[0].name]
    raise UnsupportedFeatureError("a scatter whose update region is not add/mul/min/max/set")


_WINDOW_SELECTS = frozenset({"GE", "GT", "LE", "LT"})


def select_and_scatter_direction(select: Graph, scatter: Graph) -> str:
    """The comparison of a select_and_scatter that jax emits for max/min pooling gradients."""
    if scatter_combiner(scatter) != "add":
        raise UnsupportedFeatureError("a select_and_scatter that does not scatter with add")
    compare = [op for op in select.ops if op.name == "compare" and op.results == select.outputs]
    if not compare or compare[0].operands != select.inputs:
        raise UnsupportedFeatureError("a select_and_scatter whose select is not one comparison")
    direction = compare[0].attrs["direction"]
    if direction not in _WINDOW_SELECTS:
        raise UnsupportedFeatureError(f"a select_and_scatter selecting with {direction}")
    return str(direction)


def _depends_on(region: Graph) -> set[Value]:
    """The region inputs that its outputs depend on, through its ops."""
    producer = producers(region)
    seen: set[Value] = set()
    stack = list(region.outputs)
    while stack:
        value = stack.pop()
        if value in seen:
            continue
        seen.add(value)
        if value in producer:
            stack.extend(producer[value].operands)
    return seen & set(region.inputs)


def sort_num_keys(region: Graph) -> int:
    """How many leading operands a jax sort comparator orders by (lexicographically, ascending).

    A comparator's inputs come in pairs (lhs_i, rhs_i) per operand; jax's comparators read the
    pairs of the first `num_keys` operands and compare them with "less than".
    """
    for op in region.ops:
        if op.name == "compare" and op.attrs["direction"] not in _SORT_DIRECTIONS:
            raise UnsupportedFeatureError(f"a sort comparator using {op.attrs['direction']}")
    used = {region.inputs.index(v) for v in _depends_on(region)}
    keys = len(used) // 2
    if keys == 0 or used != set(range(2 * keys)):
        raise UnsupportedFeatureError("a sort comparator that is not lexicographic on leading keys")
    return keys

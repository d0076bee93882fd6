"""Unrolling counted loops: a `while` that runs a known number of times (what `lax.scan` and
`lax.fori_loop` with static bounds lower to) becomes that many copies of its body.

The values do not change: every copy runs the body's ops on what the previous one made, in the
same order, and the condition, which is known to hold exactly `trips` times, is dropped. What
changes is what later passes can see: each copy's ops on their own, so a scan over
micro-batches can be partitioned over IPUs and scheduled phase-major (every micro-batch of a
layer in that layer's phase, as PopXL runs gradient accumulation). Ops inside a body carry
scopes relative to the loop; their copies carry the loop's scope in front
(`jit(step)/while/body/layer0/...`), so named scopes still find them.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping

import numpy as np

from lowering.ir import Graph, Op, Value, max_value_id, producers, walk

MAX_TRIPS = 128  # longer loops stay loops (a scan over GPT-3's 96 layers unrolls)
MAX_OPS = 50_000  # nor is a loop unrolled into more ops than this


def loop_counter(op: Op) -> int | None:
    """Which of a `while`'s carried values its condition compares `i < n` on, when it does."""
    found = _counter_test(op)
    return found[0] if found is not None else None


def _counter_test(op: Op) -> tuple[int, Value] | None:
    """A `while`'s condition `i < n` on a carried `i`: i's place among the carried values, and
    n."""
    cond, _ = op.regions
    compare = next((o for o in cond.ops if o.results == cond.outputs), None)
    if compare is None or compare.name != "compare" or compare.attrs["direction"] != "LT":
        return None
    counter, limit = compare.operands
    return (cond.inputs.index(counter), limit) if counter in cond.inputs else None


def counted_trips(op: Op, made: Mapping[Value, Op]) -> int | None:
    """How many times a `while` runs, when it counts `i` from a constant by 1 while `i < n`,
    `n` a constant; None otherwise."""
    cond, body = op.regions
    found = _counter_test(op)
    if found is None:
        return None
    index, limit = found
    start = _constant(op.operands[index], made)
    bound = _constant(limit, {**made, **producers(cond)})
    if start is None or bound is None or not _steps_by_one(body, index):
        return None
    return max(0, bound - start)


def _constant(value: Value, made: Mapping[Value, Op]) -> int | None:
    op = made.get(value)
    if op is None or op.name != "constant" or np.size(op.attrs["value"]) != 1:
        return None
    return int(np.asarray(op.attrs["value"]).reshape(()))


def _steps_by_one(body: Graph, index: int) -> bool:
    """Whether the body's next counter is its counter plus the constant 1."""
    made = producers(body)
    step = made.get(body.outputs[index])
    if step is None or step.name != "add":
        return False
    counter = body.inputs[index]
    others = [v for v in step.operands if v != counter]
    return len(others) == 1 and len(step.operands) == 2 and _constant(others[0], made) == 1


def unroll_limit(op: Op, made: Mapping[Value, Op]) -> str | None:
    """Why `unroll_loops` leaves a counted loop whole: its trips over `MAX_TRIPS`, or its copies
    over `MAX_OPS` ops; None for a loop within both, or one that does not count."""
    trips = counted_trips(op, made) if op.name == "while" else None
    if trips is None:
        return None
    if trips > MAX_TRIPS:
        return f"{trips:,} trips, over the unroll limit of {MAX_TRIPS:,} trips"
    ops = trips * sum(1 for _ in walk(op.regions[1]))
    if ops > MAX_OPS:
        return f"{trips:,} trips of {ops // trips:,} ops, over the unroll limit of {MAX_OPS:,} ops"
    return None


def unroll_loops(graph: Graph) -> Graph:
    """The graph with its counted top-level loops unrolled (within `MAX_TRIPS` and `MAX_OPS`)."""
    made = producers(graph)
    ids = itertools.count(1 + max_value_id(graph))
    unrolled: dict[Value, Value] = {}  # a loop's result -> its last copy's
    ops: list[Op] = []
    changed = False
    for op in graph.ops:
        op = renamed(op, unrolled)
        trips = counted_trips(op, made) if op.name == "while" else None
        if trips is None or unroll_limit(op, made) is not None:
            ops.append(op)
            continue
        copies, results = _unrolled(op, trips, ids)
        ops += copies
        unrolled.update(zip(op.results, results, strict=True))
        changed = True
    if not changed:
        return graph
    outputs = tuple(unrolled.get(v, v) for v in graph.outputs)
    return dataclasses.replace(graph, ops=tuple(ops), outputs=outputs)


def _unrolled(op: Op, trips: int, ids: itertools.count) -> tuple[list[Op], tuple[Value, ...]]:
    """The body's ops `trips` times, each copy reading the last one's results; every value a
    copy defines, in nested regions too, is new."""
    body = op.regions[1]
    prefix = f"{op.loc.scope}/body"
    carried = tuple(op.operands)
    ops: list[Op] = []
    for _ in range(trips):
        mapping: dict[Value, Value] = dict(zip(body.inputs, carried, strict=True))
        for inner in body.ops:
            copy = _copied(inner, mapping, ids)
            if not inner.loc.scope.startswith("jit("):
                copy = dataclasses.replace(
                    copy, loc=dataclasses.replace(inner.loc, scope=f"{prefix}/{inner.loc.scope}")
                )
            ops.append(copy)
        carried = tuple(mapping.get(v, v) for v in body.outputs)
    return ops, carried


def _fresh(value: Value, ids: itertools.count) -> Value:
    return Value(next(ids), value.shape, value.dtype)


def _copied(op: Op, mapping: dict[Value, Value], ids: itertools.count) -> Op:
    """`op` with its reads renamed by `mapping`, its results and everything its regions define
    made new (and added to `mapping`)."""
    regions = tuple(_copied_graph(r, mapping, ids) for r in op.regions)
    results = tuple(_fresh(v, ids) for v in op.results)
    operands = tuple(mapping.get(v, v) for v in op.operands)
    mapping.update(zip(op.results, results, strict=True))
    return dataclasses.replace(op, operands=operands, results=results, regions=regions)


def _copied_graph(graph: Graph, outer: dict[Value, Value], ids: itertools.count) -> Graph:
    mapping = dict(outer)
    inputs = tuple(_fresh(v, ids) for v in graph.inputs)
    mapping.update(zip(graph.inputs, inputs, strict=True))
    ops = tuple(_copied(o, mapping, ids) for o in graph.ops)
    outputs = tuple(mapping.get(v, v) for v in graph.outputs)
    return dataclasses.replace(graph, inputs=inputs, ops=ops, outputs=outputs)


def renamed(op: Op, mapping: Mapping[Value, Value]) -> Op:
    """`op` reading `mapping[v]` for every value `v` it or its regions read from outside."""
    if not mapping:
        return op
    operands = tuple(mapping.get(v, v) for v in op.operands)
    regions = tuple(_renamed_graph(r, mapping) for r in op.regions)
    if operands == op.operands and all(a is b for a, b in zip(regions, op.regions, strict=True)):
        return op
    return dataclasses.replace(op, operands=operands, regions=regions)


def _renamed_graph(graph: Graph, mapping: Mapping[Value, Value]) -> Graph:
    inner = {k: v for k, v in mapping.items() if k not in set(graph.inputs)}
    ops = tuple(renamed(o, inner) for o in graph.ops)
    outputs = tuple(inner.get(v, v) for v in graph.outputs)
    if outputs == graph.outputs and all(a is b for a, b in zip(ops, graph.ops, strict=True)):
        return graph
    return dataclasses.replace(graph, ops=ops, outputs=outputs)

"""Casts copied into the chains that read them, as XLA's fusion duplicates a cheap producer into
each of its consumers rather than store its result.

A cast read by several ops cannot fuse into any of them (`fusion` fuses a value only into its
one reader), so it would run as a superstep of its own and store its whole result: a batch
norm's backward pass reads the activation cast to float32 twice (the recomputed mean of squares
and the gradient of the square), which kept a float32 copy of every activation it normalises.
When every reader would take the cast into its chain (an elementwise op of the cast's shape,
or a reduction of it), each gets a copy instead, made just before it on a result of its own;
the element is cast again in each chain (a cycle or less per element), nothing is stored.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable

from lowering.ir import Op, Value, op_reads
from lowering.siblings import reduces_one
from lowering.vocabulary import ELEMENTWISE


def copy_casts(
    ops: list[Op], outputs: Iterable[Value], ids: itertools.count, key: Callable[[Op], tuple]
) -> list[Op]:
    """`ops` with each cast that all its readers would fuse copied into each of them; `ops`
    itself when there is none."""
    casts = {op.results[0] for op in ops if op.name == "convert"} - set(outputs)
    if not casts:
        return ops
    readers: defaultdict[Value, list[int]] = defaultdict(list)  # of the casts alone
    for index, op in enumerate(ops):
        for v in casts.intersection(op_reads(op)):
            readers[v].append(index)
    copied = [
        i
        for i, op in enumerate(ops)
        if op.name == "convert"
        and op.results[0] in casts
        and len(readers[op.results[0]]) > 1
        and all(_absorbs(ops[j], op, key) for j in readers[op.results[0]])
    ]
    if not copied:
        return ops
    before: defaultdict[int, list[Op]] = defaultdict(list)  # reader -> the copies it reads
    renamed: defaultdict[int, dict[Value, Value]] = defaultdict(dict)
    for i in copied:
        cast = ops[i]
        (result,) = cast.results
        for j in readers[result]:
            fresh = Value(next(ids), result.shape, result.dtype)
            before[j].append(dataclasses.replace(cast, results=(fresh,)))
            renamed[j][result] = fresh
    dropped = set(copied)
    out: list[Op] = []
    for index, op in enumerate(ops):
        if index in dropped:
            continue
        out += before.get(index, [])
        names = renamed.get(index)
        out.append(op if names is None else _reading(op, names))
    return out


def _absorbs(reader: Op, cast: Op, key: Callable[[Op], tuple]) -> bool:
    """Whether `reader` would fuse `cast`: an elementwise op of the cast's shape reading it
    as an operand, or a reduction of one tensor reducing it, in the same fusion key."""
    (value,) = cast.results
    if key(reader) != key(cast) or value not in reader.operands:
        return False
    if reader.name == "reduce":
        return reduces_one(reader) and reader.operands[0] is value
    return (
        reader.name in ELEMENTWISE
        and len(reader.results) == 1
        and reader.results[0].shape == value.shape
    )


def _reading(op: Op, names: dict[Value, Value]) -> Op:
    return dataclasses.replace(op, operands=tuple(names.get(v, v) for v in op.operands))

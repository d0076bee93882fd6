"""Casts copied into the chains that read them, as XLA's fusion duplicates a cheap producer into
each of its consumers rather than store its result.

A cast read by several ops cannot fuse into any of them (`fusion` fuses a value only into its
one reader), so it would run as a superstep of its own and store its whole result: a batch
norm's backward pass reads the activation cast to float32 twice (the recomputed mean of squares
and the gradient of the square), which kept a float32 copy of every activation it normalises.
When every reader would take the cast into its chain (an elementwise op of the cast's shape,
or a reduction of it), each gets a copy instead, made just before it on a result of its own;
the element is cast again in each chain (a cycle or less per element), nothing is stored.
Who reads each value (`readers_of`) is found once, for this pass and for `fusion`'s grouping.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence

from lowering.ir import Op, Value, op_reads
from lowering.loops import renamed
from lowering.siblings import reduces_one
from lowering.vocabulary import ELEMENTWISE


def readers_of(ops: Sequence[Op]) -> dict[Value, list[int]]:
    """Who reads each value: the indices of the ops that read it (as an operand or from a
    region), in order, each once."""
    readers: dict[Value, list[int]] = {}
    for index, op in enumerate(ops):
        for v in op_reads(op) if op.regions else op.operands:
            read = readers.get(v)
            if read is None:
                readers[v] = [index]
            elif read[-1] != index:  # x * x reads x once
                read.append(index)
    return readers


def copy_casts(
    ops: list[Op],
    readers: Mapping[Value, list[int]],
    outputs: Iterable[Value],
    ids: itertools.count,
    key: Callable[[Op], tuple],
) -> list[Op]:
    """`ops` with each cast that all its readers (`readers_of(ops)`) would fuse copied into
    each of them; `ops` itself when there is none."""
    kept = set(outputs)
    copied = [
        i
        for i, op in enumerate(ops)
        if op.name == "convert"
        and op.results[0] not in kept
        and len(readers.get(op.results[0], ())) > 1
        and all(_absorbs(ops[j], op, key) for j in readers[op.results[0]])
    ]
    if not copied:
        return ops
    return made_at_readers(ops, {ops[i].results[0]: ops[i] for i in copied}, ids)


def made_at_readers(ops: list[Op], copied: Mapping[Value, Op], ids: itertools.count) -> list[Op]:
    """`ops` with each op of `copied` (by its one result, in program order) made again just
    before each op that reads that result as an operand, which then reads its own copy; the
    op itself is dropped. The copies before one reader come in program order."""
    position = {v: k for k, v in enumerate(copied)}
    out: list[Op] = []
    for op in ops:
        if op.results and copied.get(op.results[0]) is op:
            continue
        read = sorted((v for v in set(op.operands) if v in position), key=position.__getitem__)
        names = {v: Value(next(ids), v.shape, v.dtype) for v in read}
        out += [dataclasses.replace(copied[v], results=(names[v],)) for v in read]
        out.append(renamed(op, names))
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

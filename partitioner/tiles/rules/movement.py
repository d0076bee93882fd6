"""The on-tile work of ops that run over the whole tensor (`whole`), one rule per op.

Data movement is what most of them do: a tile writes its block of the result from elements the
exchange brought or that were there already. How fast depends on the runs it copies
(`cost.copies`): a transpose moves single elements and runs PopLibs' transpose vertices, a
slice of whole rows copies long runs, a gather copies one slice per index. The others (sort,
windows, control flow) are charged their work at the vector rates of `cost.vector`.

Each rule returns the busiest tile's cycles and whether they are on-tile copies ("copy",
shown apart in the report) or computation ("compute").
"""

from __future__ import annotations

import math
from collections.abc import Callable

from lowering import ELEMENTWISE, Op
from partitioner.cost.copies import (
    copy_cycles,
    fill_cycles,
    slice_cycles,
    transpose_cycles,
)
from partitioner.cost.vector import (
    binary_cycles,
    elementwise_cycles,
    reduce_cycles,
    select_cycles,
)
from partitioner.target import Target

Work = tuple[int, str]
# (op, elements of the result on the busiest tile, extra work per tile, target) -> work
WorkRule = Callable[[Op, int, int, Target], Work]


def _itemsize(op: Op) -> int:
    return op.results[0].dtype.itemsize


def _run(op: Op, elements: int, last: int) -> int:
    """Bytes of a contiguous run of `last` elements, at most the tile's block."""
    return _itemsize(op) * max(1, min(elements, last))


def _copy(op: Op, elements: int, last: int) -> Work:
    return copy_cycles(elements * _itemsize(op), _run(op, elements, last)), "copy"


def _transpose(op: Op, elements: int, extra: int, target: Target) -> Work:
    """Source dims that stay innermost in order make runs that copy; otherwise each element
    moves alone, as a transpose of [rows, cols] matrices: cols the source's innermost dim,
    rows the result's dims inside it."""
    perm = list(op.attrs["permutation"])
    shape = op.operands[0].shape
    n = len(perm)
    kept = 0
    while kept < n and perm[n - 1 - kept] == n - 1 - kept:
        kept += 1
    if kept:
        return _copy(op, elements, math.prod(shape[n - kept :]))
    inner = perm.index(n - 1)
    cols = min(shape[n - 1], elements)
    rows = max(1, min(math.prod(shape[perm[d]] for d in range(inner + 1, n)), elements // cols))
    matrices = math.ceil(elements / (rows * cols))
    return transpose_cycles(matrices, rows, cols, _itemsize(op), target), "copy"


def _slice(op: Op, elements: int, extra: int, target: Target) -> Work:
    start, limit, stride = (op.attrs[k][-1] for k in ("start_indices", "limit_indices", "strides"))
    last = (limit - start) if stride == 1 else 1
    return _copy(op, elements, last)


def _last_dim(op: Op, elements: int, extra: int, target: Target) -> Work:
    """Runs as long as the result's last dim (a slice by IPU, a concatenation that is not along
    the last dim)."""
    shape = op.results[0].shape
    return _copy(op, elements, shape[-1] if shape else 1)


def _concatenate(op: Op, elements: int, extra: int, target: Target) -> Work:
    shape = op.results[0].shape
    if op.attrs["dimension"] != len(shape) - 1:
        return _copy(op, elements, shape[-1])
    return _copy(op, elements, math.gcd(*(v.shape[-1] for v in op.operands)))


def _pad(op: Op, elements: int, extra: int, target: Target) -> Work:
    """The operand's rows copied, the padding filled."""
    low, high, interior = op.attrs["padding_config"][-1]
    source = op.operands[0].shape
    last = 1 if interior else math.gcd(source[-1], low, high) if source else 1
    added = op.results[0].size - op.operands[0].size
    padding = math.ceil(added * elements / max(1, op.results[0].size))
    cycles, _ = _copy(op, elements - padding, last)
    return cycles + fill_cycles(padding, op.results[0].dtype, target), "copy"


def _reverse(op: Op, elements: int, extra: int, target: Target) -> Work:
    shape = op.results[0].shape
    last = 1 if (len(shape) - 1) in op.attrs["dimensions"] else shape[-1]
    return _copy(op, elements, last)


def _gather(op: Op, elements: int, extra: int, target: Target) -> Work:
    """`MultiSlice`: one slice per index, in runs of the gathered slice's last extent."""
    sizes = op.attrs["slice_sizes"]
    return _multi_slice(op, elements, sizes[-1] if sizes else 1, target), "copy"


def _dynamic_slice(op: Op, elements: int, extra: int, target: Target) -> Work:
    sizes = op.attrs["slice_sizes"]
    return _multi_slice(op, elements, sizes[-1] if sizes else 1, target), "copy"


def _dynamic_update_slice(op: Op, elements: int, extra: int, target: Target) -> Work:
    """The update written in place: its share of the tiles, in runs of its last dim."""
    update = op.operands[1]
    share = math.ceil(update.size * elements / max(1, op.results[0].size))
    last = update.shape[-1] if update.shape else 1
    return _multi_slice(op, share, last, target), "copy"


def _scatter(op: Op, elements: int, extra: int, target: Target) -> Work:
    """`MultiUpdateOp`: the updates' share written at their indices and combined."""
    update = op.operands[-1]
    share = math.ceil(update.size * elements / max(1, op.results[0].size))
    last = update.shape[-1] if update.shape else 1
    write = _multi_slice(op, share, last, target)
    combine = binary_cycles("add", share, op.results[0].dtype, target)
    return write + combine, "copy"


def _multi_slice(op: Op, elements: int, run: int, target: Target) -> int:
    run = max(1, min(run, elements))
    offsets = math.ceil(elements / run)
    return slice_cycles(offsets, run * _itemsize(op), _itemsize(op), target)


def _fill(op: Op, elements: int, extra: int, target: Target) -> Work:
    return fill_cycles(elements, op.results[0].dtype, target), "compute"


def _mask(op: Op, elements: int, extra: int, target: Target) -> Work:
    return select_cycles(elements, target), "compute"


def _vector_work(op: Op, elements: int, extra: int, target: Target) -> Work:
    """Sorting, windows and control flow: their FLOPs on the tile (at least one per element)
    at the vector rate of an add (A: docs/target.md)."""
    dtype = op.operands[0].dtype if op.operands else op.results[0].dtype
    return binary_cycles("add", max(elements, extra), dtype, target), "compute"


def _reduce_window(op: Op, elements: int, extra: int, target: Target) -> Work:
    window = max(1, math.ceil(extra / max(1, elements)))
    return reduce_cycles(elements, window, op.results[0].dtype, False, 1, target), "compute"


def _select_and_scatter(op: Op, elements: int, extra: int, target: Target) -> Work:
    return select_cycles(max(elements, extra), target), "compute"


def _combine(op: Op, elements: int, extra: int, target: Target) -> Work:
    """A reducing collective adds what it receives into its block (GCL's reductions)."""
    return binary_cycles("add", elements, op.results[0].dtype, target), "compute"


def _received(op: Op, elements: int, extra: int, target: Target) -> Work:
    """A gathering collective writes what it receives where it belongs: exchange only."""
    return 0, "compute"


def _elementwise(op: Op, elements: int, extra: int, target: Target) -> Work:
    """An elementwise op whose operands broadcast: its vertex over the tile's block."""
    dtype = op.operands[-1].dtype if op.name == "select" else op.operands[0].dtype
    direction = op.attrs.get("direction", "") if op.name == "compare" else ""
    result = op.results[0].dtype
    return elementwise_cycles(op.name, elements, dtype, result, target, direction), "compute"


# Every op a tile rule hands to `whole`: those of `tile_rules._WHOLE`, collectives, reshapes
# of tensors not mapped linearly, and elementwise ops whose operands broadcast.
WHOLE_WORK: dict[str, WorkRule] = {
    **dict.fromkeys(ELEMENTWISE, _elementwise),
    "reshape": _last_dim,
    "iota": _fill,
    "transpose": _transpose,
    "slice": _slice,
    "dynamic_slice": _dynamic_slice,
    "dynamic_update_slice": _dynamic_update_slice,
    "concatenate": _concatenate,
    "pad": _pad,
    "reverse": _reverse,
    "gather": _gather,
    "scatter": _scatter,
    "sort": _vector_work,
    "top_k": _vector_work,
    "reduce_window": _reduce_window,
    "select_and_scatter": _select_and_scatter,
    "while": _vector_work,
    "case": _vector_work,
    "shard_slice": _last_dim,
    "shard_mask": _mask,
    "shard_index": _fill,
    "partition_id": _fill,
    "all_reduce": _combine,
    "reduce_scatter": _combine,
    "all_gather": _received,
    "all_to_all": _received,
    "collective_permute": _received,
}


def whole_work(op: Op, elements: int, flops: int, target: Target) -> Work:
    """The busiest tile's cycles for `op` with `elements` result elements and `flops` of work
    (its share of the op's and its regions' FLOPs)."""
    return WHOLE_WORK[op.name](op, elements, flops, target)

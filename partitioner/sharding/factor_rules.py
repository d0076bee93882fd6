"""Factor rules: how each op's tensor dimensions correspond, einsum style, for propagation.

As in Shardy, an op's dimensions are grouped into factors: `(i,k),(k,j)->(i,j)` has factors
i, j and k, and k is a reduction factor. Sharding a factor over mesh axes shards every dimension
mapped to it; sharding a reduction factor leaves the results as partial sums over those axes. A
dimension mapped to no factor (None) must be whole on every IPU for this op: the partitioner
gathers it first. `FACTOR_RULES` names a rule for every op of the vocabulary, with no default:
an op added to the vocabulary without a decision here fails `tests/test_tables.py`. Ops whose
dimensions do not split independently (yet) say so with `_replicated_factor_rule`, which asks
for everything whole; the partitioner reports each tensor such an op gathers (`explain()`).
A dim that a slice, pad, concatenation or update reads at an offset corresponds where the window
keeps most of it (`mostly`): the partitioner runs it with halos (`halo`), or gathers the dim.
The record itself is `factors.Factors`; the convolution's rule is in `conv_factors`.
"""

from __future__ import annotations

import dataclasses
import functools

from lowering import COLLECTIVES, ELEMENTWISE, FUSIONS, SHARD_OPS, Op, binary_op, scatter_combiner
from partitioner.sharding.conv_factors import convolution_factor_rule
from partitioner.sharding.factors import Dims as Dims
from partitioner.sharding.factors import FactorRule as FactorRule
from partitioner.sharding.factors import Factors as Factors
from partitioner.sharding.factors import project as project
from partitioner.sharding.library_factors import LIBRARY_FACTOR_RULES

Shape = tuple[int, ...]


# The commonest rules (constants, elementwise ops, broadcasts: most ops of a program) are
# cached by the shapes they read: a program repeats a few shapes over its layers, and the
# rules are asked again for every program of a plan search.


def _replicated_factor_rule(op: Op) -> Factors:
    """Everything whole: for ops whose dimensions do not split independently."""
    return _replicated_factors(
        tuple([len(v.shape) for v in op.operands]), tuple([len(v.shape) for v in op.results])
    )


@functools.lru_cache(maxsize=1024)
def _replicated_factors(operands: tuple[int, ...], results: tuple[int, ...]) -> Factors:
    return Factors(
        tuple((None,) * rank for rank in operands),
        tuple((None,) * rank for rank in results),
        (),
        rule="replicated",
    )


def _elementwise_factor_rule(op: Op) -> Factors:
    return _elementwise_factors(
        tuple([v.shape for v in op.operands]), tuple([v.shape for v in op.results])
    )


@functools.lru_cache(maxsize=4096)
def _elementwise_factors(operands: tuple[Shape, ...], results: tuple[Shape, ...]) -> Factors:
    shape = results[0]
    if any(s not in (shape, ()) for s in operands):  # bitcasts that change the width
        return _replicated_factors(
            tuple([len(s) for s in operands]), tuple([len(s) for s in results])
        )
    same = tuple(range(len(shape)))
    dims = tuple(same if s == shape else () for s in operands)
    return Factors(dims, (same,) * len(results), shape, rule="elementwise")


def _identity_factor_rule(op: Op) -> Factors:
    """Result i is operand i (barriers, annotations): each pair shares its factors."""
    factors: list[Dims] = []
    sizes: list[int] = []
    for value in op.operands:
        factors.append(tuple(range(len(sizes), len(sizes) + len(value.shape))))
        sizes.extend(value.shape)
    return Factors(tuple(factors), tuple(factors), tuple(sizes), rule="identity")


def _loop_factor_rule(op: Op) -> Factors:
    """A `while`'s result i is its operand i carried through the trips: they share factors."""
    return dataclasses.replace(_identity_factor_rule(op), rule="loop")


def _dot_general_factor_rule(op: Op) -> Factors:
    (lc, rc), (lb, rb) = op.attrs["dimension_numbers"]
    lhs, rhs = op.operands
    lhs_free = [d for d in range(len(lhs.shape)) if d not in lc and d not in lb]
    rhs_free = [d for d in range(len(rhs.shape)) if d not in rc and d not in rb]
    sizes = [lhs.shape[d] for d in lb] + [lhs.shape[d] for d in lhs_free]
    sizes += [rhs.shape[d] for d in rhs_free] + [lhs.shape[d] for d in lc]
    left: list[int | None] = [None] * len(lhs.shape)
    right: list[int | None] = [None] * len(rhs.shape)
    for f, (l_dim, r_dim) in enumerate(zip(lb, rb, strict=True)):
        left[l_dim], right[r_dim] = f, f
    first_free = len(lb)
    for i, d in enumerate(lhs_free):
        left[d] = first_free + i
    first_rhs = first_free + len(lhs_free)
    for i, d in enumerate(rhs_free):
        right[d] = first_rhs + i
    first_k = first_rhs + len(rhs_free)
    for i, (l_dim, r_dim) in enumerate(zip(lc, rc, strict=True)):
        left[l_dim], right[r_dim] = first_k + i, first_k + i
    result = tuple(range(first_k))
    reduction = frozenset(range(first_k, first_k + len(lc)))
    return Factors((tuple(left), tuple(right)), (result,), tuple(sizes), reduction, "dot_general")


# Reductions that split across IPUs: each IPU reduces its part, then a collective of the same
# kind finishes the job (a sum stays a pending partial sum; max and min finish at once).
SPLITTABLE_REDUCTIONS = {"add": "sum", "maximum": "max", "minimum": "min"}


def reduction_kind(op: Op) -> str | None:
    """ "sum", "max" or "min" when a reduce's region is that one op on its two inputs."""
    if len(op.operands) != 2:
        return None
    (region,) = op.regions
    name = binary_op(region)
    return SPLITTABLE_REDUCTIONS.get(name) if name is not None else None


def _reduce_factor_rule(op: Op) -> Factors:
    x = op.operands[0]
    dims = op.attrs["dimensions"]
    kept = [d for d in range(len(x.shape)) if d not in dims]
    # A sum, max or min can be split across IPUs and finished by an AllReduce of that kind;
    # other reductions (argmax, products) are gathered whole first.
    splittable = reduction_kind(op) is not None
    operand = tuple(d if d in kept or splittable else None for d in range(len(x.shape)))
    half = len(op.operands) // 2
    operands = (operand,) * half + ((),) * half
    results = (tuple(kept),) * len(op.results)
    reduction = frozenset(dims) if splittable else frozenset()
    return Factors(operands, results, x.shape, reduction, "reduce")


def _transpose_factor_rule(op: Op) -> Factors:
    perm = op.attrs["permutation"]
    x = op.operands[0]
    return Factors((tuple(range(len(x.shape))),), (tuple(perm),), x.shape, rule="transpose")


def _broadcast_in_dim_factor_rule(op: Op) -> Factors:
    mapped = tuple(op.attrs["broadcast_dimensions"])
    return _broadcast_factors(op.operands[0].shape, op.results[0].shape, mapped)


@functools.lru_cache(maxsize=4096)
def _broadcast_factors(x: Shape, out: Shape, mapped: tuple[int, ...]) -> Factors:
    operand = tuple(m if x[i] == out[m] else None for i, m in enumerate(mapped))
    return Factors((operand,), (tuple(range(len(out))),), out, rule="broadcast")


def _reshape_groups(a: tuple[int, ...], b: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """Splits two shapes of equal size into runs of dims with equal products."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(a) or j < len(b):
        left, right = [i] if i < len(a) else [], [j] if j < len(b) else []
        pa = a[i] if i < len(a) else 1
        pb = b[j] if j < len(b) else 1
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(a):
                left.append(i)
                pa *= a[i]
                i += 1
            elif j < len(b):
                right.append(j)
                pb *= b[j]
                j += 1
            else:
                break
        groups.append((left, right))
    return groups


def _reshape_factor_rule(op: Op) -> Factors:
    """Dims of equal size correspond; a dim that splits into several (or several that merge)
    corresponds to the major one of them, the only one whose split keeps rows contiguous."""
    a, b = op.operands[0].shape, op.results[0].shape
    left: list[int | None] = [None] * len(a)
    right: list[int | None] = [None] * len(b)
    sizes: list[int] = []
    # Size-1 dims come and go freely; match the others.
    real_a = [d for d, n in enumerate(a) if n != 1]
    real_b = [d for d, n in enumerate(b) if n != 1]
    groups = _reshape_groups(tuple(a[d] for d in real_a), tuple(b[d] for d in real_b))
    for lhs_i, rhs_i in groups:
        lhs, rhs = [real_a[i] for i in lhs_i], [real_b[i] for i in rhs_i]
        if (len(lhs) == 1 or len(rhs) == 1) and lhs and rhs:
            f = len(sizes)
            sizes.append(min(a[lhs[0]], b[rhs[0]]))
            left[lhs[0]], right[rhs[0]] = f, f
    return Factors((tuple(left),), (tuple(right),), tuple(sizes), rule="reshape")


def _whole_dims_rule(op: Op, untouched: list[bool], name: str) -> Factors:
    """Ops that keep some dims whole (slices, pads, concatenations): those correspond."""
    shape = op.results[0].shape
    dims = tuple(d if untouched[d] else None for d in range(len(shape)))
    operands = tuple(
        dims if len(v.shape) == len(shape) else (None,) * len(v.shape) for v in op.operands
    )
    return Factors(operands, (dims,), shape, rule=name)


def mostly(part: int, whole: int) -> bool:
    """Whether a window of `part` rows keeps most of a dim of `whole`: the dim stays split
    across it, each IPU's block read with its neighbours' edge rows (`halo`), else gathered."""
    return 2 * part > whole


def _slice_factor_rule(op: Op) -> Factors:
    x = op.operands[0]
    kept = [
        st == 1 and mostly(lim - s, n)
        for s, lim, st, n in zip(
            op.attrs["start_indices"],
            op.attrs["limit_indices"],
            op.attrs["strides"],
            x.shape,
            strict=True,
        )
    ]
    return _whole_dims_rule(op, kept, "slice")


def _pad_factor_rule(op: Op) -> Factors:
    sizes = zip(op.operands[0].shape, op.results[0].shape, strict=True)
    kept = [
        interior == 0 and mostly(max(0, n + min(low, 0) + min(high, 0)), max(n, m))
        for (low, high, interior), (n, m) in zip(op.attrs["padding_config"], sizes, strict=True)
    ]
    return _whole_dims_rule(op, kept, "pad")


def _reverse_factor_rule(op: Op) -> Factors:
    dims = op.attrs["dimensions"]
    return _whole_dims_rule(op, [d not in dims for d in range(len(op.results[0].shape))], "rev")


def _concatenate_factor_rule(op: Op) -> Factors:
    """Dims not joined correspond; the joined one to the pieces that make most of it (the long
    piece of a `jnp.roll`, whose split dim is its blocks shifted: a halo)."""
    axis = op.attrs["dimension"]
    shape = op.results[0].shape
    dims = tuple(range(len(shape)))
    operands = tuple(
        dims if mostly(v.shape[axis], shape[axis]) else (*dims[:axis], None, *dims[axis + 1 :])
        for v in op.operands
    )
    return Factors(operands, (dims,), shape, rule="concat")


def _dynamic_slice_factor_rule(op: Op) -> Factors:
    x = op.operands[0]
    whole = [s == n for s, n in zip(op.attrs["slice_sizes"], x.shape, strict=True)]
    return _whole_dims_rule(op, whole, "dynamic_slice")


def _dynamic_update_slice_factor_rule(op: Op) -> Factors:
    x, update = op.operands[:2]
    kept = [mostly(u, n) for u, n in zip(update.shape, x.shape, strict=True)]
    return _whole_dims_rule(op, kept, "dynamic_update_slice")


def _iota_factor_rule(op: Op) -> Factors:
    """Every dim splits; along the counting dim (integers only) each IPU adds its offset."""
    shape = op.results[0].shape
    whole = op.attrs["dimension"] if op.attrs["dtype"].kind not in "iu" else None
    dims = tuple(None if d == whole else d for d in range(len(shape)))
    return Factors((), (dims,), shape, rule="iota")


def _sort_factor_rule(op: Op) -> Factors:
    axis = op.attrs["dimension"] % len(op.operands[0].shape)
    untouched = [d != axis for d in range(len(op.operands[0].shape))]
    shape = op.operands[0].shape
    dims = tuple(d if untouched[d] else None for d in range(len(shape)))
    return Factors((dims,) * len(op.operands), (dims,) * len(op.results), shape, rule="sort")


def _top_k_factor_rule(op: Op) -> Factors:
    shape = op.operands[0].shape
    dims = (*range(len(shape) - 1), None)
    return Factors((dims,), (dims, dims), shape, rule="top_k")


def _gather_factor_rule(op: Op) -> Factors:
    """Index batch dims correspond to the result's batch dims (and, for batched gathers such as
    take_along_axis, to the operand's batching dims); operand dims taken whole (the embedding
    width of a table lookup) correspond to the result's offset dims."""
    a = op.attrs
    operand, indices = op.operands
    out = op.results[0]
    batch_out = [d for d in range(len(out.shape)) if d not in a["offset_dims"]]
    batch_in = [d for d in range(len(indices.shape)) if d != a["index_vector_dim"]]
    window = [
        d
        for d in range(len(operand.shape))
        if d not in a["collapsed_slice_dims"] and d not in a["operand_batching_dims"]
    ]
    result: list[int | None] = list(range(len(out.shape)))
    idx: list[int | None] = [None] * len(indices.shape)
    for i, o in zip(batch_in, batch_out, strict=True):
        idx[i] = o
    opnd: list[int | None] = [None] * len(operand.shape)
    for ob, ib in zip(a["operand_batching_dims"], a["start_indices_batching_dims"], strict=True):
        opnd[ob] = idx[ib]
    for w, o in zip(window, a["offset_dims"], strict=True):
        whole = a["slice_sizes"][w] == operand.shape[w] and w not in a["start_index_map"]
        if whole:
            opnd[w] = o
        else:
            result[o] = None
    sizes = list(out.shape)
    reduction: frozenset[int] = frozenset()
    looked_up = lookup_dim(op)
    if looked_up is not None:
        # A lookup into a table split along the looked-up dim: each IPU looks up the rows it
        # holds, zeros the rest, and the partial results sum to the lookup (vocab-parallel).
        opnd[looked_up] = len(sizes)
        reduction = frozenset({len(sizes)})
        sizes.append(operand.shape[looked_up])
    operands = (tuple(opnd), tuple(idx))
    return Factors(operands, (tuple(result),), tuple(sizes), reduction, "gather")


def lookup_dim(op: Op) -> int | None:
    """The operand dim a gather or scatter indexes one row at a time, if there is exactly one."""
    a = op.attrs
    if op.name == "gather":
        dims, taken = a["start_index_map"], a["collapsed_slice_dims"]
        single = len(dims) == 1 and a["slice_sizes"][dims[0]] == 1
    else:
        dims, taken = a["scatter_dims_to_operand_dims"], a["inserted_window_dims"]
        single = len(dims) == 1
    if single and dims[0] in taken and dims[0] not in a["operand_batching_dims"]:
        return int(dims[0])
    return None


def window_write(op: Op) -> bool:
    """Whether a scatter writes one window as large as its operand's rank at one index vector
    (`x.at[1:-1, 1:-1].set(v)`): a dynamic update slice in scatter's clothes."""
    a, (operand, indices, updates) = op.attrs, op.operands
    every = tuple(range(len(operand.shape)))
    windows = tuple(a["update_window_dims"]) == tuple(range(len(updates.shape))) == every
    plain = not a["inserted_window_dims"] and not a["operand_batching_dims"]
    return windows and plain and len(indices.shape) == 1 and a["index_vector_dim"] == 0


def _scatter_factor_rule(op: Op) -> Factors:
    """The operand's dims taken whole by every update window, and batching dims (the transpose
    of a batched gather), correspond across operand, updates and result; indexed dims stay
    whole, except where one window writes most of them (`window_write`, a halo's business).
    The other scatter dims of the updates stay whole too, except in a scatter-add, where
    they are reduction factors."""
    a = op.attrs
    operand, indices, updates = op.operands
    rank = len(operand.shape)
    opnd: list[int | None] = [None] * rank
    idx: list[int | None] = [None] * len(indices.shape)
    upd: list[int | None] = [None] * len(updates.shape)
    window = [
        d
        for d in range(rank)
        if d not in a["inserted_window_dims"] and d not in a["operand_batching_dims"]
    ]
    written = window_write(op)
    for w, u in zip(window, a["update_window_dims"], strict=True):
        whole = updates.shape[u] == operand.shape[w] and w not in a["scatter_dims_to_operand_dims"]
        if whole or (written and mostly(updates.shape[u], operand.shape[w])):
            opnd[w], upd[u] = w, w
    scatter_upd = [d for d in range(len(updates.shape)) if d not in a["update_window_dims"]]
    scatter_idx = [d for d in range(len(indices.shape)) if d != a["index_vector_dim"]]
    for ob, ib in zip(a["operand_batching_dims"], a["scatter_indices_batching_dims"], strict=True):
        opnd[ob] = ob
        idx[ib] = ob
        upd[scatter_upd[scatter_idx.index(ib)]] = ob
    looked_up = lookup_dim(op)
    if looked_up is not None:
        # Scattering into a table split along the scattered dim: each IPU keeps the updates
        # for its rows (the others fall out of bounds, which scatter drops).
        opnd[looked_up] = looked_up
    dims = tuple(opnd)
    sizes = list(operand.shape)
    reduction = set()
    if scatter_combiner(op.regions[0]) == "add":
        # A scatter-add sums its updates: each IPU can scatter its share of them, leaving the
        # result a partial sum (the partitioner keeps the operand on one IPU of the group).
        for u, i in zip(scatter_upd, scatter_idx, strict=True):
            if upd[u] is None and idx[i] is None:
                idx[i] = upd[u] = len(sizes)
                reduction.add(len(sizes))
                sizes.append(updates.shape[u])
    return Factors(
        (dims, tuple(idx), tuple(upd)),
        (dims,),
        tuple(sizes),
        frozenset(reduction),
        rule="scatter",
    )


def _unwindowed(op: Op, *dilations: str) -> Dims:
    """The dims a window op's window does not span (one element, no stride, padding or
    dilation): those correspond between its operands and results; the others stay whole."""
    a = op.attrs
    plain = [
        w == 1 and s == 1 and p == (0, 0)
        for w, s, p in zip(a["window_dimensions"], a["window_strides"], a["padding"], strict=True)
    ]
    for name in dilations:
        plain = [ok and d == 1 for ok, d in zip(plain, a[name], strict=True)]
    return tuple(d if ok else None for d, ok in enumerate(plain))


def _reduce_window_factor_rule(op: Op) -> Factors:
    half = len(op.operands) // 2
    dims = _unwindowed(op, "base_dilation", "window_dilation")
    shape = op.operands[0].shape
    return Factors((dims,) * half + ((),) * half, (dims,) * half, shape, rule="reduce_window")


def _select_and_scatter_factor_rule(op: Op) -> Factors:
    """A pooling gradient: the dims its window does not span (batch, channels) correspond
    between the pooled input, the gradient it scatters and the result."""
    dims = _unwindowed(op)
    return Factors((dims, dims, ()), (dims,), op.operands[0].shape, rule="select_and_scatter")


FACTOR_RULES: dict[str, FactorRule] = {
    **LIBRARY_FACTOR_RULES,  # linear algebra, FFTs, host callbacks
    **dict.fromkeys(ELEMENTWISE, _elementwise_factor_rule),
    "constant": _replicated_factor_rule,  # no operands; a constant is made on every IPU
    "iota": _iota_factor_rule,
    "broadcast_in_dim": _broadcast_in_dim_factor_rule,
    "reshape": _reshape_factor_rule,
    "transpose": _transpose_factor_rule,
    "slice": _slice_factor_rule,
    "dynamic_slice": _dynamic_slice_factor_rule,
    "dynamic_update_slice": _dynamic_update_slice_factor_rule,
    "concatenate": _concatenate_factor_rule,
    "pad": _pad_factor_rule,
    "reverse": _reverse_factor_rule,
    "gather": _gather_factor_rule,
    "dot_general": _dot_general_factor_rule,
    "reduce": _reduce_factor_rule,
    "reduce_window": _reduce_window_factor_rule,
    "scatter": _scatter_factor_rule,
    "sort": _sort_factor_rule,
    "top_k": _top_k_factor_rule,
    "convolution": convolution_factor_rule,
    "select_and_scatter": _select_and_scatter_factor_rule,
    "sharding_constraint": _identity_factor_rule,
    # shard_map: its operands and results take the specs it names (`propagation`), its body
    # is already per IPU (`partition` inlines it).
    "manual_computation": _replicated_factor_rule,
    "optimization_barrier": _identity_factor_rule,
    # A loop's carried values keep their shardings from trip to trip; propagation ties them to
    # its body's inputs and outputs (`propagation`), and the partitioner splits the body.
    "while": _loop_factor_rule,
    # Not split across IPUs yet: runs whole on every IPU, its operands gathered first.
    "case": _replicated_factor_rule,
    # Ops the partitioner inserts into per-IPU programs; a global program has none.
    **dict.fromkeys(COLLECTIVES | SHARD_OPS, _replicated_factor_rule),
    # made after partitioning (`lowering.fusion`): never propagated through
    **dict.fromkeys(FUSIONS, _replicated_factor_rule),
}

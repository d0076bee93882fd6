"""Replica axes: the mesh axes a program runs data parallel over, found from its shardings.

Graphcore's replicas hold the same parameters and split the batch; replicated tensor sharding,
the gradients' reduction and the gathers of phased weights all run over them. Which mesh axes
are replica axes does not depend on their names: an axis is one when some input is split over
it (the batch) and the inputs replicated over it (the parameters and optimizer state) hold more
bytes than those split over it. A tensor-parallel axis splits the parameters, so most bytes are
split over it; an axis nothing is split over does no parallel work. `replica_axes=` overrides
the rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from lowering import COLLECTIVES, SHARD_OPS, Graph, Op, Value, op_reads
from partitioner.errors import ConfigError
from partitioner.sharding.specs import Sharding


def derive_replica_axes(
    graph: Graph, shardings: Sequence[Sharding], axis_names: Sequence[str]
) -> tuple[str, ...]:
    """The mesh axes over which the inputs are mostly replicated and partly split."""
    found = []
    for axis in axis_names:
        split = sum(
            v.nbytes for v, s in zip(graph.inputs, shardings, strict=True) if axis in s.axes
        )
        whole = sum(v.nbytes for v in graph.inputs) - split
        if split and whole > split:
            found.append(axis)
    return tuple(found)


def check_replica_axes(axes: Sequence[str], mesh: Mapping[str, int]) -> tuple[str, ...]:
    """A user's `replica_axes=`, checked against the mesh."""
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    unknown = [a for a in axes if a not in mesh]
    if unknown or len(set(axes)) != len(axes):
        raise ConfigError(
            f"replica_axes={list(axes)}: name each replica axis once, from the mesh's axes "
            f"{list(mesh)}"
        )
    return axes


# Ops after which a value differs across the IPUs of their axes, or agrees across them.
_SPLITTING = SHARD_OPS | {"reduce_scatter", "all_to_all", "collective_permute"}
_JOINING = COLLECTIVES - _SPLITTING
_ACROSS = COLLECTIVES | SHARD_OPS  # the ops over mesh axes
_NOWHERE: frozenset[str] = frozenset()


def varying_axes(graph: Graph, input_shardings: Sequence[Sharding]) -> dict[Value, frozenset[str]]:
    """For every value of a per-IPU program, the mesh axes over which its IPUs hold different
    data (shard_map's notion of a varying value): an input varies over the axes that split it,
    an all-reduce or all-gather makes its result agree over its axes (each result of a
    combined one as its own operand would), a shard op or
    reduce-scatter makes it differ, and any other op varies where its inputs do. A value is
    replicated over every other axis of the mesh."""
    return varying_over(graph.inputs, graph.ops, input_shardings)


def varying_over(
    inputs: Sequence[Value], ops: Iterable[Op], input_shardings: Sequence[Sharding]
) -> dict[Value, frozenset[str]]:
    """`varying_axes` of the ops `ops` run in order on `inputs` (a scheduled program's tasks)."""
    varying: dict[Value, frozenset[str]] = {
        v: frozenset(s.axes) for v, s in zip(inputs, input_shardings, strict=True)
    }
    for op in ops:
        if op.name not in _ACROSS:  # most ops: they vary where what they read does
            inherited = _varying_of(op_reads(op), varying)
            for result in op.results:
                varying[result] = inherited
            continue
        axes = frozenset(op.attrs.get("axes", ()))
        # A collective the combiner merged acts on each operand alone: its i-th result varies
        # as its i-th operand does (a gradient buffer mixes tp-split and tp-replicated ones).
        combined = len(op.operands) == len(op.results) > 1
        groups = (
            [((v,), (r,)) for v, r in zip(op.operands, op.results, strict=True)]
            if combined
            else [(op_reads(op), op.results)]
        )
        for reads, results in groups:
            inherited = _varying_of(reads, varying)
            inherited = inherited - axes if op.name in _JOINING else inherited | axes
            varying.update(dict.fromkeys(results, inherited))
    return varying


def _varying_of(values: Iterable[Value], varying: Mapping[Value, frozenset[str]]) -> frozenset[str]:
    """The axes any of `values` varies over; one value's own set, not a new one, when the
    others add none (most ops: GPT-3 asks for 100,000)."""
    found = _NOWHERE
    for value in values:
        axes = varying.get(value, _NOWHERE)
        if not axes <= found:
            found = found | axes if found else axes
    return found


def replicated_over(
    varying: Mapping[Value, frozenset[str]], values: Sequence[Value], axes: Sequence[str]
) -> frozenset[Value]:
    """The values among `values` that agree across every IPU of `axes`."""
    return frozenset(v for v in values if not set(axes) & varying.get(v, frozenset()))

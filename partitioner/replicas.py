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

from collections.abc import Mapping, Sequence

from lowering import Graph, Value
from partitioner.cost.streaming import Replicas
from partitioner.errors import ConfigError
from partitioner.partition import Partitioned
from partitioner.sharding import Sharding


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


def replicated_tensors(partitioned: Partitioned, axes: Sequence[str]) -> frozenset[Value]:
    """Per-IPU tensors replicated over every replica axis (weights, optimizer state, reduced
    gradients): replicated tensor sharding keeps 1/replicas of each in streaming memory."""
    graph = partitioned.graph
    pairs = [
        *zip(graph.inputs, partitioned.input_shardings, strict=True),
        *zip(graph.outputs, partitioned.output_shardings, strict=True),
        *partitioned.local_shardings.items(),
    ]
    return frozenset(v for v, sharding in pairs if not set(axes) & sharding.axes)


def replicas_of(
    partitioned: Partitioned | None, axes: Sequence[str], mesh: Mapping[str, int]
) -> Replicas:
    """Replicated tensor sharding over `axes`: the replica count and the tensors it applies to."""
    if partitioned is None or not axes:
        return Replicas()
    count = 1
    for axis in axes:
        count *= mesh[axis]
    return Replicas(count, replicated_tensors(partitioned, axes))

"""Shardings in the style of Shardy, spelled like JAX.

A tensor's sharding gives, for each dimension, the mesh axes it is split over (major to minor),
and the axes over which it is a partial sum still to be reduced (a row-parallel matmul's output).
Users write `jax.sharding.PartitionSpec`s; `from_spec` checks them against the mesh and the
tensor's rank. A dimension that does not divide by its axes is padded up to a multiple (and masked
where padding could change a result), never silently replicated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jax.sharding import PartitionSpec

from lowering import Graph, Value
from partitioner.errors import ShardingError

Axes = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Sharding:
    dims: tuple[Axes, ...]
    partial: Axes = ()

    @classmethod
    def replicated(cls, rank: int) -> Sharding:
        return cls(((),) * rank)

    @property
    def axes(self) -> set[str]:
        return {a for d in self.dims for a in d} | set(self.partial)

    def shards(self, dim: int, mesh: Mapping[str, int]) -> int:
        return math.prod(mesh[a] for a in self.dims[dim])

    def local_shape(self, shape: tuple[int, ...], mesh: Mapping[str, int]) -> tuple[int, ...]:
        """Each IPU's block: every dimension divided by its axes, rounded up (padding)."""
        return tuple(-(-n // self.shards(d, mesh)) for d, n in enumerate(shape))

    def without_partial(self) -> Sharding:
        return Sharding(self.dims)

    def __str__(self) -> str:
        dims = ", ".join("{" + ",".join(d) + "}" for d in self.dims)
        partial = f" partial{{{','.join(self.partial)}}}" if self.partial else ""
        return f"[{dims}]{partial}"


def from_spec(
    spec: PartitionSpec | None, shape: tuple[int, ...], mesh: Mapping[str, int], what: str
) -> Sharding:
    """A user's PartitionSpec for a tensor of `shape`, checked against the mesh: as in jax, the
    axes that split a dimension must divide it (the partitioner pads only its own choices)."""
    rank = len(shape)
    if spec is None:
        return Sharding.replicated(rank)
    if not isinstance(spec, PartitionSpec):
        raise ShardingError(
            f"{what}: expected a jax.sharding.PartitionSpec, got {type(spec).__name__} {spec!r}"
        )
    entries = tuple(spec)
    if len(entries) > rank:
        raise ShardingError(
            f"{what}: PartitionSpec {spec} has {len(entries)} entries for a tensor of rank "
            f"{rank}; give at most one entry per dimension"
        )
    dims: list[Axes] = []
    for entry in entries + (None,) * (rank - len(entries)):
        axes = () if entry is None else tuple(entry) if isinstance(entry, tuple) else (entry,)
        dims.append(axes)
    _check_axes(dims, mesh, spec, what)
    _check_divides(dims, shape, mesh, spec, what)
    return Sharding(tuple(dims))


def _check_divides(
    dims: list[Axes], shape: tuple[int, ...], mesh: Mapping[str, int], spec: object, what: str
) -> None:
    for dim, (axes, size) in enumerate(zip(dims, shape, strict=True)):
        ways = math.prod(mesh[a] for a in axes)
        if size % ways:
            split = " x ".join(f"{a}={mesh[a]}" for a in axes)
            raise ShardingError(
                f"{what}: PartitionSpec {spec} splits dimension {dim} of shape {shape} "
                f"({size}) over {split}, which does not divide it; as in jax, a split "
                f"dimension must be a multiple of {ways}: pad it to "
                f"{-(-size // ways) * ways} or leave it unsplit"
            )


def _check_axes(dims: list[Axes], mesh: Mapping[str, int], spec: object, what: str) -> None:
    used = [a for d in dims for a in d]
    unknown = [a for a in used if a not in mesh]
    if unknown:
        axes = ", ".join(f"{a}={n}" for a, n in mesh.items())
        raise ShardingError(
            f"{what}: PartitionSpec {spec} names the axes {unknown}, which the mesh ({axes}) "
            f"does not have; use the mesh's axes {sorted(mesh)}"
        )
    repeated = sorted({a for a in used if used.count(a) > 1})
    if repeated:
        raise ShardingError(
            f"{what}: PartitionSpec {spec} uses the axes {repeated} more than once; an axis "
            "can split only one dimension"
        )


def user_shardings(
    graph: Graph,
    mesh: Mapping[str, int],
    in_specs: Sequence[PartitionSpec | None],
    out_specs: Sequence[PartitionSpec | None],
) -> tuple[dict[Value, Sharding], dict[int, Sharding]]:
    """The user's specs as shardings of the graph's inputs and outputs (by output index),
    checked against the mesh and each tensor's rank (on one IPU too, where every valid spec
    means replication)."""
    names = graph.input_names or tuple(f"argument {i}" for i in range(len(graph.inputs)))
    inputs = {
        value: from_spec(spec, value.shape, mesh, f"in_shardings for {name}")
        for value, name, spec in zip(graph.inputs, names, in_specs, strict=True)
        if spec is not None
    }
    outputs: dict[int, Sharding] = {
        i: from_spec(spec, value.shape, mesh, f"out_shardings for output {i}")
        for i, (value, spec) in enumerate(zip(graph.outputs, out_specs, strict=True))
        if spec is not None
    }
    return inputs, outputs

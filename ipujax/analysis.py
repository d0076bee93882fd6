"""`Compiled`'s answers in jax's shapes: `cost_analysis()` (jax's keys: flops, transcendentals,
bytes accessed), `memory_analysis()` (the fields of jax's `CompiledMemoryStats`) and the input
and output shardings as `NamedSharding`s, all filled from ipujax's program and cost model (per
IPU, as jax's are per device) rather than from an XLA executable."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

from lowering import op_cost, walk
from partitioner import Built, Mesh, Sharding


@dataclass(frozen=True, slots=True)
class MemoryAnalysis:
    """Bytes on one IPU, by jax's `CompiledMemoryStats` names; `temp_size_in_bytes` is the
    peak of activations and temporaries summed over its tiles, `generated_code_size_in_bytes`
    the code and vertex state of all its tiles; and ipujax's own: the fullest tile and a tile's
    capacity."""

    argument_size_in_bytes: int
    output_size_in_bytes: int
    alias_size_in_bytes: int
    temp_size_in_bytes: int
    generated_code_size_in_bytes: int
    peak_tile_bytes: int
    tile_bytes: int


def cost_analysis(built: Built, seconds: float) -> dict[str, float]:
    """Per IPU: the FLOPs, transcendentals and bytes read and written of the program each IPU
    runs (jax's keys), and the step's predicted seconds (ipujax's)."""
    costs = [op_cost(op) for op in walk(built.graph)]
    return {
        "flops": float(sum(c.flops for c in costs)),
        "transcendentals": float(sum(c.transcendentals for c in costs)),
        "bytes accessed": float(sum(c.bytes for c in costs)),
        "seconds": seconds,
    }


def memory_analysis(built: Built) -> MemoryAnalysis:
    graph, memory = built.graph, built.memory
    return MemoryAnalysis(
        argument_size_in_bytes=sum(v.nbytes for v in graph.inputs),
        output_size_in_bytes=sum(v.nbytes for v in graph.outputs),
        alias_size_in_bytes=0,
        temp_size_in_bytes=int(memory.not_always_live.sum()),
        generated_code_size_in_bytes=int(memory.code.sum()),
        peak_tile_bytes=int(memory.total.max()),
        tile_bytes=built.target.bytes_per_tile,
    )


def _spec(sharding: Sharding) -> PartitionSpec:
    entries = [None if not axes else axes[0] if len(axes) == 1 else axes for axes in sharding.dims]
    return PartitionSpec(*entries)


def named_shardings(built: Built, which: str, tree: Any) -> Any:
    """The program's inputs' or outputs' shardings as `NamedSharding`s over the mesh's
    abstract twin (the IPUs are not jax devices), in the arguments' or results' tree."""
    mesh: Mesh = built.mesh
    abstract = AbstractMesh(mesh.axis_shapes, mesh.axis_names)
    partitioned = built.partitioned
    values = built.graph.inputs if which == "inputs" else built.graph.outputs
    if partitioned is None:
        found = tuple(Sharding.replicated(len(v.shape)) for v in values)
    else:
        found = partitioned.input_shardings if which == "inputs" else partitioned.output_shardings
    leaves = [NamedSharding(abstract, _spec(s)) for s in found]
    return jax.tree.unflatten(tree, leaves)

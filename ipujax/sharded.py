"""Partitioning a lowered program over the IPUs of a mesh: the user's specs become shardings,
propagation and partitioning produce the per-IPU program, and its collectives' traffic decides
where each mesh axis sits among the physical IPUs."""

from __future__ import annotations

from collections.abc import Sequence

from jax.sharding import PartitionSpec

from ipujax.mesh import Mesh
from lowering import Graph, Value
from lowering.vocabulary import COLLECTIVES
from partitioner.links import ring_bytes
from partitioner.partition import Partitioned, partition
from partitioner.propagation import propagate_shardings
from partitioner.sharding import Sharding, from_spec


def user_shardings(
    graph: Graph,
    mesh: Mesh,
    in_specs: Sequence[PartitionSpec | None],
    out_specs: Sequence[PartitionSpec | None],
) -> tuple[dict[Value, Sharding], dict[int, Sharding]]:
    """The user's specs as shardings of the graph's inputs and outputs, checked against the
    mesh and each tensor's rank (on one IPU too, where every valid spec means replication)."""
    sizes = mesh.shape
    names = graph.input_names or tuple(f"argument {i}" for i in range(len(graph.inputs)))
    inputs = {
        value: from_spec(spec, len(value.shape), sizes, f"in_shardings for {name}")
        for value, name, spec in zip(graph.inputs, names, in_specs, strict=True)
        if spec is not None
    }
    outputs: dict[int, Sharding] = {
        i: from_spec(spec, len(value.shape), sizes, f"out_shardings for output {i}")
        for i, (value, spec) in enumerate(zip(graph.outputs, out_specs, strict=True))
        if spec is not None
    }
    return inputs, outputs


def partition_program(
    graph: Graph,
    mesh: Mesh,
    in_specs: Sequence[PartitionSpec | None],
    out_specs: Sequence[PartitionSpec | None],
) -> Partitioned:
    inputs, outputs = user_shardings(graph, mesh, in_specs, out_specs)
    fixed_outputs = {graph.outputs[i]: s for i, s in outputs.items()}
    propagated = propagate_shardings(graph, inputs, fixed_outputs)
    return partition(graph, propagated, mesh.shape, outputs)


def axis_traffic(graph: Graph) -> dict[str, int]:
    """Bytes each mesh axis's collectives move per IPU, to place the busiest axis innermost."""
    traffic: dict[str, int] = {}
    for op in graph.ops:
        if op.name not in COLLECTIVES:
            continue
        buffer = op.results[0].nbytes if op.name == "all_gather" else op.operands[0].nbytes
        sent, _ = ring_bytes(op.name, buffer, op.attrs["group_size"])
        for axis in op.attrs["axes"]:
            traffic[axis] = traffic.get(axis, 0) + sent
    return traffic


def explain(partitioned: Partitioned, mesh: Mesh) -> str:
    """Every input's and op result's sharding, with where it came from."""
    prop = partitioned.propagated
    graph = partitioned.global_graph
    lines = [f"shardings over {mesh}:"]
    names = graph.input_names or ()
    for i, value in enumerate(graph.inputs):
        name = names[i] if i < len(names) else f"arg{i}"
        lines.append(f"  {name} {value.type_str} {prop.shardings[value]}  <- {prop.origins[value]}")
    for op in graph.ops:
        for value in op.results:
            lines.append(
                f"  {value} = {op.name} {value.type_str} {prop.shardings[value]}"
                f"  <- {prop.origins[value]}"
            )
    return "\n".join(lines)

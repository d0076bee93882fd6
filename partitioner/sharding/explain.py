"""`explain()`: every tensor's sharding and where it came from, and the ops that forced a split
tensor whole, as a person reads them next to the source (its files named from the project's
folder, `lowering.shorten_paths`)."""

from __future__ import annotations

from lowering import shorten_paths
from partitioner.mesh import Mesh
from partitioner.sharding.partition import Partitioned


def explain(partitioned: Partitioned, mesh: Mesh) -> str:
    """Every input's and op result's sharding, with where it came from; then each op that ran
    whole and gathered a split tensor."""
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
    if partitioned.forced_whole:
        lines.append("ops that ran whole on every IPU, gathering a split tensor:")
        lines += [f"  {forced}" for forced in partitioned.forced_whole]
    # The origins and forced ops name absolute files (as jax recorded them); shortened once here,
    # when shown, so the compiled program itself never depends on the working directory.
    return shorten_paths("\n".join(lines))

"""Text for a compiled BSP program: each task with its layout and supersteps, as a person reads
it next to the source."""

from __future__ import annotations

from lowering import Graph, shorten_paths
from partitioner.layout import Layout
from partitioner.program import Program
from partitioner.target import Target


def _layout(layout: Layout) -> str:
    last = layout.stop - 1
    return (
        f"view {layout.view} grid {layout.grid} block {layout.block} "
        f"on tiles {layout.start}..{last}"
    )


def format_program(program: Program, graph: Graph, target: Target) -> str:
    steps = program.supersteps
    total = sum(s.cycles for s in steps)
    lines = [
        f"BSP program on {target.name} ({target.tiles_per_ipu:,} tiles): "
        f"{len(program.tasks)} tasks, {len(steps)} supersteps, {total:,} cycles",
        "inputs:",
    ]
    names = graph.input_names or tuple(f"arg{i}" for i in range(len(graph.inputs)))
    for value, name, layout in zip(graph.inputs, names, program.input_layouts, strict=True):
        lines.append(f"  {value} {name}: {value.type_str}  {_layout(layout)}")
    for index, task in enumerate(program.tasks):
        results = ", ".join(f"{v}: {v.type_str}" for v in task.op.results)
        lines.append(
            f"task {index}: {results} = {task.op.name}  # {shorten_paths(str(task.op.loc))}"
        )
        for layout in task.result_layouts:
            lines.append(f"    layout {_layout(layout)}")
        for s in task.supersteps:
            lines.append(
                f"    superstep {s.name}: {s.tiles} tiles; exchange {s.busiest_tile_bytes:,} "
                f"B/tile ({s.exchange_cycles:,} cyc), sync {s.sync_cycles} cyc, "
                f"compute {s.compute_cycles:,} cyc"
            )
    outputs = ", ".join(str(v) for v in program.outputs)
    lines.append(f"outputs: {outputs}")
    return "\n".join(lines)

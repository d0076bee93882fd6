"""The memory check and report: the fullest tiles, the largest tensors on a tile with where
each came from, and `check_memory`, which raises `OutOfMemoryError` for a tile over its budget
naming the tile, the bytes, the largest tensors there and the remedies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lowering import Graph, Op, Value
from lowering import producers as graph_producers
from partitioner.errors import OutOfMemoryError
from partitioner.memory.tiles import TileMemory
from partitioner.program import Program
from partitioner.target import Target


def _describe(value: Value, producers: dict[Value, Op], arguments: dict[Value, str]) -> str:
    producer = producers.get(value)
    if producer is not None:
        return f"{producer.name} {value.type_str} at {producer.loc}"
    return f"argument {arguments[value]} {value.type_str}"


def producers_of(program: Program, graph: Graph) -> dict[Value, Op]:
    """The op that makes each value: the program's tasks' (which may rewrite the graph's ops),
    else the graph's (a pipeline stage's program reads values other stages make)."""
    return {**graph_producers(graph), **{v: t.op for t in program.tasks for v in t.op.results}}


def largest_on_tile(
    memory: TileMemory,
    program: Program,
    graph: Graph,
    tile: int,
    count: int = 5,
    producers: dict[Value, Op] | None = None,
) -> list[tuple[int, str]]:
    """The largest tensors on a tile at its peak, with where each came from. Pass `producers`
    (`producers_of(program, graph)`) when asking about several tiles, to build it once."""
    at = int(memory.peak_task[tile])
    producers = producers if producers is not None else producers_of(program, graph)
    sizes = sorted(
        (
            (s.bytes_per_tile, s.value)
            for s in memory.storages
            if s.layout.start <= tile < s.layout.stop and s.live_at(at)
        ),
        key=lambda pair: pair[0],
        reverse=True,
    )
    # Described only down to the count-th size (ties kept): a large program has thousands.
    cutoff = sizes[count - 1][0] if len(sizes) >= count > 0 else 0
    # The arguments' names by value, found once: GPT-3's 96 layers tie thousands of weights at
    # the cutoff, and a list's index per weight took 0.7 s of its report.
    names = graph.input_names or ("input",) * len(graph.inputs)
    arguments = dict(zip(graph.inputs, names, strict=False))
    here = [(size, _describe(v, producers, arguments)) for size, v in sizes if size >= cutoff]
    task = program.tasks[at] if program.tasks else None
    if task is not None:
        for temp in task.temporaries:
            if temp.start <= tile < temp.start + temp.tiles:
                here.append(
                    (temp.bytes_per_tile, f"{temp.what} of {task.op.name} at {task.op.loc}")
                )
    return sorted(here, reverse=True)[:count]


@dataclass(frozen=True, slots=True)
class TileUsage:
    """One of the fullest tiles at its peak: bytes in all, its largest tensors, and its bytes
    by category (`code_memory.CATEGORIES`; empty in reports written before they were kept)."""

    ipu: int
    tile: int
    bytes: int
    tensors: tuple[tuple[int, str], ...]  # (bytes on this tile, what and where from)
    categories: tuple[tuple[str, int], ...] = ()  # (category, bytes on this tile)


def fullest_tiles(
    memory: TileMemory, program: Program, graph: Graph, count: int = 5
) -> tuple[TileUsage, ...]:
    """The `count` fullest tiles (of IPU 0: every IPU runs the same program), largest first."""
    total = memory.total
    fullest = np.argsort(-total, kind="stable")[:count]
    producers = producers_of(program, graph)
    return tuple(
        TileUsage(
            0,
            int(t),
            int(total[t]),
            tuple(largest_on_tile(memory, program, graph, int(t), producers=producers)),
            memory.categories_of(int(t)),
        )
        for t in fullest
    )


def check_memory(
    memory: TileMemory, program: Program, graph: Graph, target: Target, ipu: int = 0
) -> None:
    """Raises `OutOfMemoryError` for the fullest tile if it needs more than it has."""
    total = memory.total
    tile = int(total.argmax())
    needed = int(total[tile])
    if needed <= target.bytes_per_tile:
        return
    lines = [
        f"IPU {ipu}, tile {tile} needs {needed:,} bytes but has {target.bytes_per_tile:,} "
        f"({target.name}): over by {needed - target.bytes_per_tile:,} bytes "
        f"({int((total > target.bytes_per_tile).sum())} of {target.tiles_per_ipu} tiles are over).",
        "Largest tensors on that tile:",
    ]
    lines += [
        f"  {size:>12,} B  {what}" for size, what in largest_on_tile(memory, program, graph, tile)
    ]
    lines.append(
        "Remedies: spread the program over more IPUs (ipujax.make_mesh with in_shardings), "
        "use a smaller batch, or keep weights in streaming memory with phases='auto'."
    )
    raise OutOfMemoryError("\n".join(lines))

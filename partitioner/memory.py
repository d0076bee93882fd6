"""Tile memory, checked as Poplar checks it: per tile, at compile time, before anything runs.

Per tile, PopVision shows always-live variables (program inputs such as weights, and constants),
not-always-live variables (activations and temporaries, live from the task that makes them to the
last task that reads them), and code. We compute the same from the Program: every value's bytes
per tile from its layout, its live range from the task order, each task's temporaries (the
operand blocks an exchange delivers and the partial sums a matmul keeps) during that task alone,
and an estimate of code and vertex state from the Target. A tile over its budget is an
`OutOfMemoryError` that names the tile, the bytes, the largest tensors there and the remedies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lowering import Graph, Value
from partitioner.errors import OutOfMemoryError
from partitioner.layout import Layout, tile_bytes
from partitioner.program import Program
from partitioner.target import Target


@dataclass(frozen=True, slots=True)
class Storage:
    """One tensor's storage on tiles and the tasks it is live across (inclusive)."""

    value: Value
    layout: Layout
    first: int
    last: int
    always_live: bool

    @property
    def bytes_per_tile(self) -> int:
        return tile_bytes(self.layout, self.value.dtype)


@dataclass(frozen=True, slots=True, eq=False)
class TileMemory:
    """Bytes per tile: always-live, peak not-always-live, code; and the task of the peak."""

    always_live: np.ndarray
    not_always_live: np.ndarray
    code: np.ndarray
    peak_task: np.ndarray
    storages: tuple[Storage, ...]

    @property
    def total(self) -> np.ndarray:
        return self.always_live + self.not_always_live + self.code


def _roots(program: Program) -> dict[Value, Value]:
    """Views share their source's storage: map every value to the value that owns its bytes."""
    root: dict[Value, Value] = {}
    for task in program.tasks:
        for result, alias in zip(task.op.results, task.aliases, strict=False):
            if alias is not None:
                source = task.inputs[alias]
                root[result] = root.get(source, source)
    return root


def storages(program: Program) -> tuple[Storage, ...]:
    root = _roots(program)
    end = max(0, len(program.tasks) - 1)
    first: dict[Value, int] = {}
    last: dict[Value, int] = {}
    always = set(program.inputs)
    for index, task in enumerate(program.tasks):
        if task.op.name == "constant":
            always.update(task.op.results)
        for value in task.op.results:
            owner = root.get(value, value)
            first.setdefault(owner, index)
            last[owner] = max(last.get(owner, index), index)
        for value in task.inputs:
            owner = root.get(value, value)
            last[owner] = max(last.get(owner, index), index)
    for value in program.outputs:
        last[root.get(value, value)] = end
    owners = {root.get(v, v) for v in program.layouts} - set()
    return tuple(
        Storage(v, program.layouts[v], first.get(v, 0), last.get(v, first.get(v, 0)), v in always)
        for v in owners
    )


def _add(grid: np.ndarray, first: int, last: int, start: int, stop: int, amount: int) -> None:
    """Adds `amount` over tasks first..last and tiles start..stop-1 of a 2-D difference array."""
    grid[first, start] += amount
    grid[first, stop] -= amount
    grid[last + 1, start] -= amount
    grid[last + 1, stop] += amount


def tile_memory(program: Program, target: Target) -> TileMemory:
    tiles = target.tiles_per_ipu
    tasks = max(1, len(program.tasks))
    always = np.zeros(tiles + 1, np.int64)
    live = np.zeros((tasks + 1, tiles + 1), np.int64)
    found = storages(program)
    for s in found:
        stop = min(s.layout.stop, tiles)
        if s.always_live:
            always[s.layout.start] += s.bytes_per_tile
            always[stop] -= s.bytes_per_tile
        else:
            _add(live, s.first, s.last, s.layout.start, stop, s.bytes_per_tile)
    code = np.zeros(tiles + 1, np.int64)
    for index, task in enumerate(program.tasks):
        for temp in task.temporaries:
            _add(live, index, index, temp.start, temp.start + temp.tiles, temp.bytes_per_tile)
        for step in task.supersteps:
            code[step.start] += target.code_bytes_per_step
            code[min(step.start + step.tiles, tiles)] -= target.code_bytes_per_step
    live = np.cumsum(np.cumsum(live, axis=0), axis=1)[:tasks, :tiles]
    return TileMemory(
        always_live=np.cumsum(always)[:tiles],
        not_always_live=live.max(axis=0),
        code=np.cumsum(code)[:tiles] + target.fixed_code_bytes,
        peak_task=live.argmax(axis=0),
        storages=found,
    )


def _describe(value: Value, graph: Graph, program: Program) -> str:
    if value in graph.inputs:
        name = graph.input_names[graph.inputs.index(value)] if graph.input_names else "input"
        return f"argument {name} {value.type_str}"
    producer = next(t.op for t in program.tasks if value in t.op.results)
    return f"{producer.name} {value.type_str} at {producer.loc}"


def largest_on_tile(
    memory: TileMemory, program: Program, graph: Graph, tile: int, count: int = 5
) -> list[tuple[int, str]]:
    """The largest tensors on a tile at its peak, with where each came from."""
    at = int(memory.peak_task[tile])
    here = [
        (s.bytes_per_tile, _describe(s.value, graph, program))
        for s in memory.storages
        if s.layout.start <= tile < s.layout.stop and (s.always_live or s.first <= at <= s.last)
    ]
    task = program.tasks[at] if program.tasks else None
    if task is not None:
        for temp in task.temporaries:
            if temp.start <= tile < temp.start + temp.tiles:
                here.append(
                    (temp.bytes_per_tile, f"{temp.what} of {task.op.name} at {task.op.loc}")
                )
    return sorted(here, reverse=True)[:count]


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

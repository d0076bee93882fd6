"""The BSP program's spec, run as code: what every pass after scheduling must leave true.

`lowering.verify` checks a graph (SSA order, types, the vocabulary); this module checks the
`Program` that every cost figure and the runtime read, and the tile memory swept from it:

- every task reads values that exist (program inputs, results of earlier tasks, or what its
  regions capture) and holds a layout for each, of the value's shape, on tiles that exist;
- every result has a layout of its shape on tiles that exist, and the program's layouts agree;
- every superstep runs on tiles that exist, with no negative cycles, bytes or FLOPs;
- every collective superstep carries its record, over axes of the mesh, with the group size
  the mesh gives those axes, synced over exactly that group;
- tile memory is never negative, and its categories add up to its total;
- the value uses and storages a pass hands on to a later one (the phase split's, to the memory
  sweep) are the program's own.

`passes.build` runs these after each pass when `Options.verify` is set (`ipujax.jit(verify=True)`
or IPUJAX_VERIFY=1, which the tests set); a broken invariant is a `VerifyError` naming the pass,
the task and the user's line.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from lowering import Value, VerifyError
from partitioner.layout import Layout
from partitioner.memory.liveness import PhaseBounds, Storage, Uses, storages, value_uses
from partitioner.memory.tiles import TileMemory
from partitioner.program import Program, Superstep, Task

# A superstep's figures that are counts and so never negative.
_COUNTS = (
    "tiles",
    "flops",
    "exchange_bytes",
    "compute_cycles",
    "exchange_cycles",
    "sync_cycles",
    "link_cycles",
    "start",
    "busiest_tile_bytes",
)


def verify_program(
    program: Program,
    after: str,
    mesh: Mapping[str, int] | None = None,
    outer: frozenset[Value] = frozenset(),
) -> None:
    """Raises `VerifyError` for the first broken invariant of `program` (made by pass `after`)
    on a mesh of axes `mesh` (None or empty: one IPU); a region's program may also read the
    `outer` values of the program around it."""
    _check_layouts(program.inputs, program.input_layouts, program.tiles, f"{after}: inputs")
    for value, layout in zip(program.inputs, program.input_layouts, strict=True):
        _check_same(program, value, layout, f"{after}: input {value}")
    for task, where, defined in _in_order(program, after, outer):
        _check_task(task, program, defined, mesh or {}, where)


def verify_dataflow(program: Program, after: str) -> None:
    """The part of the spec a runtime rewrite must keep (it may hand an op a scalar where the
    tiles hold a broadcast, so layouts are not its to keep): every task reads values made
    before it, and every output is made."""
    for _ in _in_order(program, after):
        pass


def _in_order(
    program: Program, after: str, outer: frozenset[Value] = frozenset()
) -> Iterator[tuple[Task, str, set[Value]]]:
    """Each task with where it is and the values made before it (the running set itself:
    copied by whoever keeps it), once its reads are checked to be among them; then the
    outputs checked to be made."""
    defined = set(program.inputs) | outer
    for index, task in enumerate(program.tasks):
        where = f"{after}: task {index} ({task.op.name} at {task.op.loc})"
        unknown = [v for v in task.inputs if v not in defined]
        if unknown:
            raise VerifyError(f"{where}: reads {unknown} before any task makes them")
        yield task, where, defined
        defined.update(task.op.results)
    missing = [v for v in program.outputs if v not in defined]
    if missing:
        raise VerifyError(f"{after}: outputs {missing} are never made")


def _check_task(
    task: Task, program: Program, defined: set[Value], mesh: Mapping[str, int], where: str
) -> None:
    _check_layouts(task.inputs, task.input_layouts, program.tiles, f"{where}: operands")
    for value, layout in zip(task.inputs, task.input_layouts, strict=True):
        if value in program.layouts:
            _check_same(program, value, layout, f"{where}: operand {value}")
    _check_layouts(task.op.results, task.result_layouts, program.tiles, f"{where}: results")
    for value, layout in zip(task.op.results, task.result_layouts, strict=True):
        _check_same(program, value, layout, f"{where}: result {value}")
    for step in task.supersteps:
        _check_step(step, program.tiles, mesh, where)
    for region in task.regions:
        verify_program(region, f"{where}: region", mesh, frozenset(defined))


def _check_layouts(
    values: tuple[Value, ...], layouts: tuple[Layout, ...], tiles: int, where: str
) -> None:
    if len(values) != len(layouts):
        raise VerifyError(f"{where}: {len(values)} values but {len(layouts)} layouts")
    for value, layout in zip(values, layouts, strict=True):
        if layout.shape != value.shape:
            raise VerifyError(f"{where}: {value} is laid out as shape {layout.shape}")
        if layout.start < 0 or layout.stop > tiles:
            raise VerifyError(
                f"{where}: {value} lies on tiles {layout.start}..{layout.stop - 1}, "
                f"the IPU has {tiles}"
            )


def _check_same(program: Program, value: Value, layout: Layout, where: str) -> None:
    """The program's table of layouts holds the one the value was made in."""
    if program.layouts.get(value) != layout:
        raise VerifyError(f"{where}: the program's layout {program.layouts.get(value)} differs")


def _check_step(step: Superstep, tiles: int, mesh: Mapping[str, int], where: str) -> None:
    negative = [name for name in _COUNTS if getattr(step, name) < 0]
    if negative:
        raise VerifyError(f"{where}: superstep {step.name!r} has negative {negative}")
    if step.start + step.tiles > tiles:
        raise VerifyError(
            f"{where}: superstep {step.name!r} runs on tiles {step.start}.."
            f"{step.start + step.tiles - 1}, the IPU has {tiles}"
        )
    if step.kind == "collective":
        _check_collective(step, mesh, where)


def _check_collective(step: Superstep, mesh: Mapping[str, int], where: str) -> None:
    record = step.collective
    if record is None:
        raise VerifyError(f"{where}: collective superstep {step.name!r} has no record")
    strange = [a for a in record.axes if a not in mesh]
    if strange:
        raise VerifyError(f"{where}: {step.name!r} runs over {strange}, not axes of {dict(mesh)}")
    group = int(np.prod([mesh[a] for a in record.axes]))
    if record.group_size != group:
        raise VerifyError(
            f"{where}: {step.name!r} has a group of {record.group_size} IPUs; axes "
            f"{record.axes} of the mesh make {group}"
        )
    if step.sync_group != "+".join(record.axes):
        raise VerifyError(
            f"{where}: {step.name!r} syncs {step.sync_group!r}, not its group {record.axes}"
        )


def verify_memory(memory: TileMemory, after: str) -> None:
    """Raises `VerifyError` when any tile's bytes are negative or the categories do not add up
    to the total."""
    parts = memory.categories()
    for name, values in parts.items():
        if values.min(initial=0) < 0:
            tile = int(np.argmin(values))
            raise VerifyError(f"{after}: tile {tile} has {int(values[tile])} B of {name}")
    total = np.sum(list(parts.values()), axis=0)
    if not np.array_equal(total, memory.total):
        tile = int(np.argmax(total != memory.total))
        raise VerifyError(
            f"{after}: tile {tile}'s categories add up to {int(total[tile])} B, "
            f"its total is {int(memory.total[tile])} B"
        )


def verify_uses(uses: Uses, program: Program, phases: PhaseBounds, after: str) -> None:
    """Raises `VerifyError` when `uses`, handed on from an earlier pass, are not `program`'s
    own value uses in `phases` (a pass between them changed what a task reads)."""
    fresh = value_uses(program, phases)
    for name, have, want in zip(("makers", "readers", "constants"), uses, fresh, strict=True):
        if have != want:
            raise VerifyError(f"{after}: the value uses handed on differ in their {name}")


def verify_storages(
    stored: Sequence[Storage], program: Program, phases: PhaseBounds, uses: Uses, after: str
) -> None:
    """Raises `VerifyError` when storages handed on from an earlier pass (made without
    shards' ways) are not `program`'s own in `phases` (a pass between them changed a layout,
    an input or an output); `uses` are the program's own, checked by `verify_uses`."""
    if tuple(stored) != storages(program, phases, uses=uses):
        raise VerifyError(f"{after}: the storages handed on differ from the program's own")

"""Tile memory, checked as Poplar checks it: per tile, at compile time, before anything runs.

Per tile, PopVision shows always-live variables (program inputs such as weights, and constants),
not-always-live variables (activations and temporaries, live from the task that makes them to the
last task that reads them), and code and state by category. We compute the same from the
Program: every value's bytes per tile from its layout, its live range from the task order, each
task's temporaries (the operand blocks an exchange delivers and the partial sums a matmul keeps)
during that task alone; vertex code, vertex state, exchange code, control code and stack come
from `code_memory`. A tile over its budget is an `OutOfMemoryError` that names the tile, the
bytes, the largest tensors there and the remedies.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from lowering import ELEMENTWISE, Graph, Op, Value
from lowering import producers as graph_producers
from partitioner.code_memory import CodeMemory, code_memory
from partitioner.errors import OutOfMemoryError
from partitioner.layout import Layout, tile_bytes
from partitioner.program import Program, Task
from partitioner.target import Target


@dataclass(frozen=True, slots=True)
class Storage:
    """One tensor's storage on tiles and the task spans (inclusive) it is on chip for.

    Unphased, a tensor has one span, from the task that makes it to the last that reads it.
    Phased, a tensor in streaming memory is on chip only in the phases that use it."""

    value: Value
    layout: Layout
    spans: tuple[tuple[int, int], ...]
    always_live: bool
    ways: int = 1  # held as a 1/ways shard (replicated tensor sharding's updates)

    @property
    def bytes_per_tile(self) -> int:
        return -(-tile_bytes(self.layout, self.value.dtype) // self.ways)

    @property
    def first(self) -> int:
        return self.spans[0][0] if self.spans else 0

    def live_at(self, task: int) -> bool:
        return self.always_live or any(a <= task <= b for a, b in self.spans)


@dataclass(frozen=True, slots=True, eq=False)
class TileMemory:
    """Bytes per tile: always-live, peak not-always-live, code and state by category; and the
    task of the peak."""

    always_live: np.ndarray
    not_always_live: np.ndarray
    code_parts: CodeMemory
    peak_task: np.ndarray
    storages: tuple[Storage, ...]
    phase_peaks: tuple[int, ...] = ()  # the fullest tile's bytes in each phase

    @property
    def code(self) -> np.ndarray:
        """Code, vertex state and stack: all but the variables."""
        return self.code_parts.total

    @property
    def total(self) -> np.ndarray:
        return self.always_live + self.not_always_live + self.code

    def categories(self) -> dict[str, np.ndarray]:
        """Bytes per tile in each category (`code_memory.CATEGORIES`); they sum to `total`."""
        variables = {
            "variables_always_live": self.always_live,
            "variables_not_always_live": self.not_always_live,
        }
        return {**variables, **self.code_parts.by_category()}

    def categories_of(self, tile: int) -> tuple[tuple[str, int], ...]:
        """One tile's bytes in each category, in the report's order."""
        return tuple((name, int(values[tile])) for name, values in self.categories().items())


def _roots(program: Program, phases: PhaseBounds | None) -> dict[Value, Value]:
    """Map every value to the value that owns its bytes: views share their source's storage,
    and an elementwise result overwrites an operand nothing reads afterwards (Poplar's in-place
    ops) when the two have the same layout and bytes and were made in the same phase (and
    neither is an argument or an output, which stream as themselves)."""
    root: dict[Value, Value] = {}
    last = _last_reads(program)
    members_last: dict[Value, int] = {}  # per owner, the last read of any value it holds
    made: dict[Value, int] = {}
    keep = set(program.inputs) | set(program.outputs)
    phase_of = phases.phase_of if phases is not None else (lambda task: 0)
    for index, task in enumerate(program.tasks):
        for result, alias in zip(task.op.results, task.aliases, strict=False):
            if alias is not None:
                source = task.inputs[alias]
                root[result] = root.get(source, source)
        if _elementwise(task) and task.op.results[0] not in keep:
            result = task.op.results[0]
            for value in task.inputs:
                owner = root.get(value, value)
                if (
                    owner not in keep
                    and owner in made
                    and members_last.get(owner, last.get(owner, -1)) <= index
                    and phase_of(made[owner]) == phase_of(index)
                    and owner.nbytes == result.nbytes
                    and program.layouts.get(owner) == program.layouts.get(result)
                ):
                    root[result] = owner
                    break
        for value in task.op.results:
            owner = root.get(value, value)
            made.setdefault(owner, index)
            members_last[owner] = max(members_last.get(owner, -1), last.get(value, index))
    return root


def _elementwise(task: Task) -> bool:
    return task.op.name in ELEMENTWISE and len(task.op.results) == 1 and not task.aliases


def _last_reads(program: Program) -> dict[Value, int]:
    last: dict[Value, int] = {}
    for index, task in enumerate(program.tasks):
        for value in task.inputs:
            last[value] = index
    for value in program.outputs:
        last[value] = len(program.tasks)  # read by the host
    return last


Uses = tuple[dict[Value, int], dict[Value, list[int]], set[Value]]


def value_uses(program: Program, phases: PhaseBounds | None = None) -> Uses:
    """Each storage owner's defining task, the tasks that read it, and the constants. They
    depend on the tasks' ops, not on their plans: a caller that asks `tile_memory` again about
    a program whose matmuls it re-planned passes them back (`uses=`) rather than paying a
    pass over every task again (a second for GPT-3's 100,000)."""
    root = _roots(program, phases)
    made: dict[Value, int] = {}
    reads: dict[Value, list[int]] = {}
    constants: set[Value] = set()
    for index, task in enumerate(program.tasks):
        if task.op.name == "constant":
            constants.update(task.op.results)
        for value in task.op.results:
            made.setdefault(root.get(value, value), index)
        for value in task.inputs:
            reads.setdefault(root.get(value, value), []).append(index)
    end = max(0, len(program.tasks) - 1)
    for value in program.outputs:
        reads.setdefault(root.get(value, value), []).append(end + 1)  # read by the host
    return made, reads, constants


def _spans(first: int, uses: list[int], phases: PhaseBounds | None) -> tuple[tuple[int, int], ...]:
    """On chip from `first` to the last use; phased, only in the phases that use it, and from
    the start of each such phase (a load) to its last use there. A value read after its phase
    (by a later phase, or by the host: a program output) is stored to streaming memory at the
    end of the phase that makes it, so it stays on chip until then."""
    end = max(uses, default=first)
    if phases is None:
        return ((first, end),)
    made_phase = phases.phase_of(first)
    last_task = phases.bounds[-1][1] - 1
    lo, hi = phases.bounds[made_phase]
    if end < hi and min(uses, default=first) >= lo:  # read only in the phase that makes it
        return ((first, end),)
    stored = any(u > last_task or phases.phase_of(u) != made_phase for u in uses)
    uses = [u for u in uses if u <= last_task]
    by_phase: dict[int, tuple[int, int]] = {}
    for task in [first, *uses]:
        phase = phases.phase_of(task)
        lo, hi = phases.bounds[phase]
        start = first if phase == made_phase else lo  # made here, or loaded at the start
        old = by_phase.get(phase)
        task = min(task, hi - 1)
        by_phase[phase] = (min(old[0], start), max(old[1], task)) if old else (start, task)
    if stored:
        lo, hi = by_phase[made_phase]
        by_phase[made_phase] = (lo, max(hi, phases.bounds[made_phase][1] - 1))
    return tuple(by_phase[p] for p in sorted(by_phase))


def storages(
    program: Program,
    phases: PhaseBounds | None = None,
    kept: frozenset[Value] = frozenset(),
    ways: Mapping[Value, int] | None = None,
    uses: Uses | None = None,
) -> tuple[Storage, ...]:
    """Every owned tensor's storage; `kept` activations stay on chip from the task that makes
    them to their last reader even across phases, and `ways` holds some as shards. `uses` is
    `value_uses(program, phases)` when the caller has it."""
    made, reads, constants = uses if uses is not None else value_uses(program, phases)
    inputs = set(program.inputs)
    owners = {v for v in program.layouts if v in made or v in inputs}
    ways = ways or {}
    found = []
    for value in owners:
        always = value in constants or (value in inputs and phases is None)
        if value in inputs:
            read_at = reads.get(value, [])
            first = min(read_at, default=0)
            spans = _spans(first, read_at, phases) if phases is not None else ((0, 0),)
            if phases is not None and not read_at:
                spans = ()
        else:
            first = made[value]
            spans = _spans(first, reads.get(value, []), None if value in kept else phases)
        found.append(Storage(value, program.layouts[value], spans, always, ways.get(value, 1)))
    return tuple(found)


class PhaseBounds:
    """Task ranges of phases, `bounds[i] = (start, stop)`, in order and covering all tasks."""

    def __init__(self, bounds: list[tuple[int, int]]) -> None:
        assert all(a == b for (_, a), (b, _) in itertools.pairwise([(0, 0), *bounds])), bounds
        self.bounds = bounds
        # Each task's phase by table: the memory sweeps ask millions of times (GPT-3 on a
        # Pod256).
        self._of = [p for p, (a, b) in enumerate(bounds) for _ in range(a, b)]

    def phase_of(self, task: int) -> int:
        """The phase of `task`; before the first, the first; past the last, the last."""
        if task >= len(self._of):
            return max(0, len(self.bounds) - 1)
        return self._of[task] if task >= 0 else 0


def tile_memory(
    program: Program,
    target: Target,
    phases: PhaseBounds | None = None,
    kept: frozenset[Value] = frozenset(),
    ways: Mapping[Value, int] | None = None,
    uses: Uses | None = None,
) -> TileMemory:
    """Per-tile memory by a sweep over tasks: each storage is added when its span starts and
    removed after it ends; each task's temporaries count during that task only. `uses` is
    `value_uses(program, phases)` when the caller has it."""
    tiles = target.tiles_per_ipu
    found = storages(program, phases, kept, ways, uses)
    always = _always_live(found, tiles)
    code = code_memory(program, target)
    extra = always + code.total
    sweep = _live_by_task(program, found, tiles)
    extra_here = sweep.segment_max(extra)
    peak = np.zeros(sweep.segments, np.int64)
    peak_task = np.zeros(sweep.segments, np.int64)
    fullest: list[np.ndarray] = []  # per task, its fullest tile's bytes
    for first, live in sweep.blocks():
        # The first task of the highest: the peak's task, as a task-by-task sweep finds it.
        top, at = live.max(axis=0), live.argmax(axis=0)
        higher = top > peak
        peak = np.where(higher, top, peak)
        peak_task = np.where(higher, first + at, peak_task)
        if phases is not None:
            fullest.append((live + extra_here).max(axis=1))
    return TileMemory(
        always_live=always,
        not_always_live=sweep.per_tile(peak),
        code_parts=code,
        peak_task=sweep.per_tile(peak_task),
        storages=found,
        phase_peaks=_phase_peaks(fullest, phases),
    )


def _phase_peaks(fullest: list[np.ndarray], phases: PhaseBounds | None) -> tuple[int, ...]:
    if phases is None or not fullest:
        return ()
    per_task = np.concatenate(fullest)
    return tuple(max(0, int(per_task[a:b].max())) for a, b in phases.bounds if b > a)


def _always_live(found: tuple[Storage, ...], tiles: int) -> np.ndarray:
    """Bytes per tile of the storages live throughout (constants; unphased, the inputs)."""
    always = np.zeros(tiles, np.int64)
    for s in found:
        if s.always_live:
            always[s.layout.start : s.layout.stop] += s.bytes_per_tile
    return always


def _live_by_task(program: Program, found: tuple[Storage, ...], tiles: int) -> _Sweep:
    """The bytes per tile live while each task runs: the not-always-live storages whose spans
    hold it, and its temporaries."""
    count = len(program.tasks)
    return _Sweep(count, tiles, _storage_events(found, count), _temporary_events(program))


class _Sweep:
    """Live bytes by task and tile, from difference arrays rather than a task-by-task sweep: a
    storage adds its bytes per tile at (first task of its span, first tile) and takes them away
    one past the last of each; cumulative sums over tasks, then tiles, give every task's bytes.

    Tiles are taken in segments, the runs between the tiles where some tensor starts or stops
    (every tile of a segment holds the same bytes), and tasks in blocks, which keeps the arrays
    small whatever the program's length (GPT-3 on a Pod256: 100,000 tasks, a few hundred
    segments of 1,472 tiles)."""

    _BLOCK = 256  # tasks per block

    def __init__(self, count: int, tiles: int, storage: _Events, temporary: _Events) -> None:
        self.count = count
        cuts = np.concatenate([storage[1], temporary[1], [0, tiles]])
        self.bounds = np.unique(np.clip(cuts, 0, tiles))  # segment starts, then `tiles`
        self.segments = len(self.bounds) - 1
        self._storage = self._in_segments(storage)
        self._temporary = self._in_segments(temporary)

    def _in_segments(self, events: _Events) -> _Events:
        rows, cols, amounts = events
        tiles = self.bounds[-1]
        return rows, np.searchsorted(self.bounds, np.clip(cols, 0, tiles)), amounts

    def blocks(self) -> Iterator[tuple[int, np.ndarray]]:
        """(first task, [tasks, segments] live bytes) for consecutive blocks of tasks."""
        carry = np.zeros(self.segments + 1, np.int64)  # live bytes' segment differences so far
        for first in range(0, self.count, self._BLOCK):
            stop = min(self.count, first + self._BLOCK)
            block = self._differences(self._storage, first, stop)
            block[0] += carry
            np.cumsum(block, axis=0, out=block)
            carry = block[-1].copy()
            block += self._differences(self._temporary, first, stop)
            yield first, np.cumsum(block[:, : self.segments], axis=1)

    def _differences(self, events: _Events, first: int, stop: int) -> np.ndarray:
        rows, cols, amounts = events
        lo, hi = np.searchsorted(rows, [first, stop])
        block = np.zeros((stop - first, self.segments + 1), np.int64)
        np.add.at(block, (rows[lo:hi] - first, cols[lo:hi]), amounts[lo:hi])
        return block

    def per_tile(self, values: np.ndarray) -> np.ndarray:
        """Per-segment values (the last axis) spread over the segment's tiles."""
        return np.repeat(values, np.diff(self.bounds), axis=-1)

    def segment_max(self, per_tile: np.ndarray) -> np.ndarray:
        """The largest of each segment's tiles' values."""
        return np.maximum.reduceat(per_tile, self.bounds[:-1])


_Events = tuple[np.ndarray, np.ndarray, np.ndarray]  # (task, tile, bytes), sorted by task


def _storage_events(found: tuple[Storage, ...], count: int) -> _Events:
    """Changes of the live bytes' tile differences: each span adds its storage's bytes from its
    first task and removes them after its last."""
    spans = [
        (a, min(b, count - 1) + 1, s.layout.start, s.layout.stop, s.bytes_per_tile)
        for s in found
        if not s.always_live
        for a, b in s.spans
    ]
    first, after, start, stop, size = np.array(spans, np.int64).reshape(-1, 5).T
    rows = np.concatenate([first, first, after, after])
    cols = np.concatenate([start, stop, start, stop])
    amounts = np.concatenate([size, -size, -size, size])
    return _by_task(rows, cols, amounts)


def _temporary_events(program: Program) -> _Events:
    """Tile differences of each task's temporaries, during that task only."""
    temps = [
        (index, temp.start, temp.start + temp.tiles, temp.bytes_per_tile)
        for index, task in enumerate(program.tasks)
        for temp in task.temporaries
    ]
    task, start, stop, size = np.array(temps, np.int64).reshape(-1, 4).T
    rows = np.concatenate([task, task])
    return _by_task(rows, np.concatenate([start, stop]), np.concatenate([size, -size]))


def _by_task(rows: np.ndarray, cols: np.ndarray, amounts: np.ndarray) -> _Events:
    order = np.argsort(rows, kind="stable")
    return rows[order], cols[order], amounts[order]


def task_excess(
    program: Program,
    target: Target,
    phases: PhaseBounds | None = None,
    extra: np.ndarray | None = None,
) -> list[int]:
    """For each task, how many bytes its fullest tile is over budget while it runs (0 when
    within), `extra` bytes per tile added throughout: which tasks a re-plan must shrink."""
    found = storages(program, phases)
    base = _always_live(found, target.tiles_per_ipu) + code_memory(program, target).total
    if extra is not None:
        base = base + extra
    sweep = _live_by_task(program, found, target.tiles_per_ipu)
    base_here = sweep.segment_max(base)
    excess: list[int] = []
    for _, live in sweep.blocks():
        fullest = (live + base_here).max(axis=1) - target.bytes_per_tile
        excess += np.maximum(fullest, 0).tolist()
    return excess


def region_bytes(program: Program, target: Target) -> np.ndarray:
    """Per tile, the peak bytes a region's own tensors and temporaries hold while it runs: all
    but its inputs and the values it captures, which the program around it holds."""
    tiles = target.tiles_per_ipu
    found = storages(program)
    sweep = _live_by_task(program, found, tiles)
    most = np.zeros(sweep.segments, np.int64)
    for _, live in sweep.blocks():
        np.maximum(most, live.max(axis=0), out=most)
    own = sweep.per_tile(most)
    inputs = set(program.inputs)
    for s in found:
        if s.always_live and s.value not in inputs:
            own[s.layout.start : s.layout.stop] += s.bytes_per_tile
    return own


def _describe(value: Value, graph: Graph, producers: dict[Value, Op]) -> str:
    producer = producers.get(value)
    if producer is not None:
        return f"{producer.name} {value.type_str} at {producer.loc}"
    index = graph.inputs.index(value)
    name = graph.input_names[index] if graph.input_names else "input"
    return f"argument {name} {value.type_str}"


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
    here = [(size, _describe(v, graph, producers)) for size, v in sizes if size >= cutoff]
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

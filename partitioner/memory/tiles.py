"""Tile memory as Poplar counts it: per tile, at compile time, before anything runs.

Per tile, PopVision shows always-live variables (program inputs such as weights, and constants),
not-always-live variables (activations and temporaries, live from the task that makes them to the
last task that reads them), and code and state by category. We compute the same from the
Program: every value's bytes per tile from its layout, its spans from `liveness`, each task's
temporaries (the operand blocks an exchange delivers and the partial sums a matmul keeps) during
that task alone, summed by a numpy sweep over tasks and tiles; vertex code, vertex state,
exchange code, control code and stack come from `code_memory`. `check` reads the result against
the tile budget.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from lowering import Value
from partitioner.memory.code import CodeMemory, code_memory
from partitioner.memory.liveness import PhaseBounds, Storage, Uses, storages, value_uses
from partitioner.program import Program
from partitioner.target import Target


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
    task_peaks: np.ndarray | None = None  # with phases: each task's fullest tile's bytes

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


def tile_memory(
    program: Program,
    target: Target,
    phases: PhaseBounds | None = None,
    kept: frozenset[Value] = frozenset(),
    ways: Mapping[Value, int] | None = None,
    uses: Uses | None = None,
    stored: tuple[Storage, ...] | None = None,
) -> TileMemory:
    """Per-tile memory by a sweep over tasks: each storage is added when its span starts and
    removed after it ends; each task's temporaries count during that task only. `uses` is
    `value_uses(program, phases)` when the caller has it, `stored` the `storages` (the same
    arguments) too: a re-plan of matmuls changes neither."""
    tiles = target.tiles_per_ipu
    found = stored if stored is not None else storages(program, phases, kept, ways, uses)
    always = _always_live(found, tiles)
    code = code_memory(program, target)
    extra = always + code.total
    sweep = _live_by_task(program, found, tiles)
    extra_here = sweep.segment_max(extra)
    sweep.narrow(headroom=int(np.abs(extra).max(initial=0)))
    peak = np.zeros(sweep.segments, np.int64)
    peak_task = np.zeros(sweep.segments, np.int64)
    fullest: list[np.ndarray] = []  # per task, its fullest tile's bytes
    for block in sweep.blocks():
        # The first task of the highest: the peak's task, as a task-by-task sweep finds it.
        top = block.spread(block.live.max(axis=0))
        higher = np.flatnonzero(top > peak)
        if len(higher):
            peak[higher] = top[higher]
            peak_task[higher] = block.first + block.spread(block.live.argmax(axis=0))[higher]
        if phases is not None:
            live = block.live
            live += block.column_max(extra_here)  # in place: the block is ours
            fullest.append(live.max(axis=1))
    per_task = np.concatenate(fullest) if fullest else None
    return TileMemory(
        always_live=always,
        not_always_live=sweep.per_tile(peak),
        code_parts=code,
        peak_task=sweep.per_tile(peak_task),
        storages=found,
        phase_peaks=_phase_peaks(per_task, phases),
        task_peaks=per_task,
    )


def _phase_peaks(per_task: np.ndarray | None, phases: PhaseBounds | None) -> tuple[int, ...]:
    if phases is None or per_task is None:
        return ()
    return tuple(max(0, int(per_task[a:b].max())) for a, b in phases.bounds if b > a)


def _always_live(found: tuple[Storage, ...], tiles: int) -> np.ndarray:
    """Bytes per tile of the storages live throughout (constants; unphased, the inputs)."""
    # A difference array over tiles, summed once, rather than a slice add per storage.
    spans = [(s.layout.start, s.layout.stop, s.bytes_per_tile) for s in found if s.always_live]
    start, stop, size = np.array(spans, np.int64).reshape(-1, 3).T
    changes = np.zeros(tiles + 1, np.int64)
    np.add.at(changes, np.clip(start, 0, tiles), size)
    np.add.at(changes, np.clip(stop, 0, tiles), -size)
    return np.cumsum(changes[:tiles])


def _live_by_task(program: Program, found: tuple[Storage, ...], tiles: int) -> _Sweep:
    """The bytes per tile live while each task runs: the not-always-live storages whose spans
    hold it, and its temporaries."""
    count = len(program.tasks)
    return _Sweep(count, tiles, _storage_events(found, count), _temporary_events(program))


@dataclass(frozen=True, slots=True, eq=False)
class _Block:
    """The live bytes of consecutive tasks from `first`: `live[task, column]`, a column per run
    of segments whose bytes stay alike through the block (from segment `starts[c]`, `widths[c]`
    segments wide)."""

    first: int
    live: np.ndarray
    starts: np.ndarray
    widths: np.ndarray

    def spread(self, values: np.ndarray) -> np.ndarray:
        """Per-column values (the last axis) given to each segment of the column."""
        return np.repeat(values, self.widths, axis=-1)

    def column_max(self, per_segment: np.ndarray) -> np.ndarray:
        """The largest of each column's segments' values."""
        return np.maximum.reduceat(per_segment, self.starts)


class _Sweep:
    """Live bytes by task and tile, from difference arrays rather than a task-by-task sweep: a
    storage adds its bytes per tile at (first task of its span, first tile) and takes them away
    one past the last of each; cumulative sums over tasks, then tiles, give every task's bytes.

    Tiles are taken in segments, the runs between the tiles where some tensor starts or stops
    (every tile of a segment holds the same bytes), and tasks in blocks, which keeps the arrays
    small whatever the program's length (GPT-3 on a Pod256: 100,000 tasks, 1,344 segments of
    1,472 tiles). A block keeps only the segment boundaries where its bytes can differ (those
    of the storages live at its start and of what starts or stops in it): GPT-3's phased blocks
    need 31 of the 1,344 on average, the rest being runs of equal bytes."""

    _BLOCK = 256  # tasks per block

    def __init__(self, count: int, tiles: int, storage: _Events, temporary: _Events) -> None:
        self.count = count
        cuts = np.concatenate([storage[1], temporary[1], [0, tiles]])
        self.bounds = np.unique(np.clip(cuts, 0, tiles))  # segment starts, then `tiles`
        self.segments = len(self.bounds) - 1
        self._storage = self._in_segments(storage)
        self._temporary = self._in_segments(temporary)
        self.dtype: type = np.int64

    def narrow(self, headroom: int = 0) -> None:
        """Blocks in 32-bit integers when no sum can leave their range: every figure a block
        holds, its differences and live bytes, is a sum of some of the events' bytes, plus
        `headroom` (bytes the caller adds to it in place). Exact, or left at 64 bits."""
        bound = headroom + sum(int(np.abs(e[2]).sum()) for e in (self._storage, self._temporary))
        self.dtype = np.int32 if bound < np.iinfo(np.int32).max else np.int64

    def _in_segments(self, events: _Events) -> _Events:
        rows, cols, amounts = events
        tiles = self.bounds[-1]
        return rows, np.searchsorted(self.bounds, np.clip(cols, 0, tiles)), amounts

    def blocks(self) -> Iterator[_Block]:
        """Consecutive blocks of tasks, each a new array, the caller's to change."""
        # The live bytes' segment differences before the block (the last entry: past the end).
        carry: np.ndarray = np.zeros(self.segments + 1, np.int64)
        rows, cols, amounts = self._storage
        for first in range(0, self.count, self._BLOCK):
            stop = min(self.count, first + self._BLOCK)
            lo, hi = np.searchsorted(rows, [first, stop])
            t_lo, t_hi = np.searchsorted(self._temporary[0], [first, stop])
            # The segment boundaries where this block's bytes can differ, and the end.
            edges = (np.flatnonzero(carry), cols[lo:hi], self._temporary[1][t_lo:t_hi])
            kept = np.unique(np.concatenate([*edges, [0, self.segments]]))
            block: np.ndarray = np.zeros((stop - first, len(kept)), self.dtype)
            block[0] += carry[kept]  # `carry` is zero off `kept`
            self._add_differences(block, self._storage, first, lo, hi, kept)
            np.cumsum(block, axis=0, dtype=self.dtype, out=block)
            np.add.at(carry, cols[lo:hi], amounts[lo:hi])
            # The few temporaries straight into the block, and the sums over columns in place.
            self._add_differences(block, self._temporary, first, t_lo, t_hi, kept)
            np.cumsum(block, axis=1, dtype=self.dtype, out=block)
            yield _Block(first, block[:, :-1], kept[:-1], np.diff(kept))

    @staticmethod
    def _add_differences(
        block: np.ndarray, events: _Events, first: int, lo: int, hi: int, kept: np.ndarray
    ) -> None:
        rows, cols, amounts = events
        columns = np.searchsorted(kept, cols[lo:hi])
        np.add.at(block, (rows[lo:hi] - first, columns), amounts[lo:hi])

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
    held = [s for s in found if not s.always_live and s.spans]
    # A storage's tiles and bytes once, repeated for each of its spans.
    tiles = [(s.layout.start, s.layout.start + s.layout.tiles, s.bytes_per_tile) for s in held]
    repeats = [len(s.spans) for s in held]
    start, stop, size = np.repeat(np.array(tiles, np.int64).reshape(-1, 3), repeats, axis=0).T
    first, last = np.array([span for s in held for span in s.spans], np.int64).reshape(-1, 2).T
    after = np.minimum(last, count - 1) + 1
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
    stored: tuple[Storage, ...] | None = None,
) -> list[int]:
    """For each task, how many bytes its fullest tile is over budget while it runs (0 when
    within), `extra` bytes per tile added throughout: which tasks a re-plan must shrink.
    `stored` is `storages(program, phases)` when the caller has it (`tile_memory`'s)."""
    found = stored if stored is not None else storages(program, phases)
    base = _always_live(found, target.tiles_per_ipu) + code_memory(program, target).total
    if extra is not None:
        base = base + extra
    sweep = _live_by_task(program, found, target.tiles_per_ipu)
    base_here = sweep.segment_max(base)
    excess: list[int] = []
    for block in sweep.blocks():
        fullest = (block.live + block.column_max(base_here)).max(axis=1) - target.bytes_per_tile
        excess += np.maximum(fullest, 0).tolist()
    return excess


def region_bytes(program: Program, target: Target, loop: bool = False) -> np.ndarray:
    """Per tile, the peak bytes a region's own tensors and temporaries hold while it runs: all
    but its inputs and the values it captures, which the program around it holds, and (a
    loop's body) the outputs it makes in place of the inputs they replace next trip."""
    tiles = target.tiles_per_ipu
    carried = dict(zip(program.outputs, program.inputs, strict=True)) if loop else None
    found = storages(program, uses=value_uses(program, carried=carried))
    sweep = _live_by_task(program, found, tiles)
    most = np.zeros(sweep.segments, np.int64)
    for block in sweep.blocks():
        np.maximum(most, block.spread(block.live.max(axis=0)), out=most)
    own = sweep.per_tile(most)
    inputs = set(program.inputs)
    for s in found:
        if s.always_live and s.value not in inputs:
            own[s.layout.start : s.layout.stop] += s.bytes_per_tile
    return own

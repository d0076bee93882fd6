"""Streaming memory in phased programs: what each phase loads, stores and gathers, what that
costs and how much of it hides behind compute, and whether streaming memory holds it all
(docs/target.md, "Streaming memory, host and phases"; docs/phases.md).

An argument is loaded at the start of every phase that reads it, an output is stored at the end
of the phase that makes it, and an activation read in a later phase is stored at the end of its
own phase and loaded again where it is read, unless it fits on chip until then (`keep_on_chip`).
Everything streamed is split over the mesh axes it is replicated over (`rts.Sharded`), and a
phase gathers what it needs whole over IPU-Links, one ring per group of axes.

Between two phases the IO path loads the next phase's inputs and stores the last one's outputs
at once (full duplex), after a fixed latency, then the gathers run. Without IO tiles that
window is exposed; with them it runs while the previous phase computes, and only what compute
does not cover is exposed. The IO tiles hold two pieces of the largest tensor streamed, one
arriving while the other is copied on; a tensor too large for two to fit streams in pieces
(`io_buffers`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from lowering import Value
from partitioner.cost.links import LinkModel
from partitioner.errors import OutOfMemoryError
from partitioner.memory.liveness import PhaseBounds, Storage, sliced_reads
from partitioner.phases.rts import Sharded
from partitioner.program import Program, Task
from partitioner.target import Target


@dataclass(frozen=True, slots=True)
class PhaseStream:
    """What one phase moves, per IPU: loaded before it, stored after it, sent gathering over
    IPU-Links (and those gathers' cycles), and the activations kept on chip across it."""

    load_bytes: int
    store_bytes: int
    gather_bytes: int
    gather_cycles: int = 0
    kept_bytes: int = 0
    largest_bytes: int = 0  # the largest single tensor it loads or stores
    # Of `load_bytes`, those a loop loads a slice a trip (`sliced_reads`), in `trips` equal
    # pieces: the first before the phase, each later one while the trip before it computes.
    trip_bytes: int = 0
    trips: int = 1


@dataclass(frozen=True, slots=True)
class PhaseCost:
    """One phase of a phased program: its cycles (streaming not hidden by compute included),
    the bytes it moves to and from streaming memory, and its fullest tile."""

    name: str
    cycles: int
    streaming_bytes: int
    peak_tile_bytes: int
    compute_cycles: int = 0
    stream_cycles: int = 0  # the IO window before it: loads, the last stores, gathers
    overlapped_cycles: int = 0  # of those, hidden behind the previous phase's compute (IO tiles)
    link_bytes: int = 0  # replicated tensor sharding's gathers, over IPU-Links
    load_bytes: int = 0
    store_bytes: int = 0
    kept_bytes: int = 0  # activations that stay on chip across the phase instead of streaming


def streaming_cycles(target: Target, nbytes: int) -> int:
    """Moving bytes between streaming memory and one IPU, at the streaming bandwidth."""
    return math.ceil(nbytes * target.clock_hz / target.streaming_bytes_per_second) if nbytes else 0


def _phases_of(s: Storage, bounds: PhaseBounds) -> list[int]:
    return [bounds.phase_of(a) for a, _ in s.spans]


def keep_on_chip(
    program: Program,
    storages: Sequence[Storage],
    bounds: PhaseBounds,
    phase_peaks: Sequence[int],
    budget: int,
    trips: Mapping[Value, int] | None = None,
) -> frozenset[Value]:
    """Activations that cross phases and may stay on chip until their last reader: smallest
    first, while the fullest tile of every phase they span stays within `budget`; one a loop's
    trips make anew (`trips`, `loops.per_trip`) holds every trip's copy."""
    trips = trips or {}
    peaks = list(phase_peaks)
    kept = set()
    streamed = set(program.inputs) | set(program.outputs)
    crossing = [s for s in storages if s.value not in streamed and len(s.spans) > 1]
    held = {s.value: s.bytes_per_tile * trips.get(s.value, 1) for s in crossing}
    for s in sorted(crossing, key=lambda s: (held[s.value], s.value.id)):
        phases = _phases_of(s, bounds)
        span = range(phases[0], phases[-1] + 1)
        if all(peaks[p] + held[s.value] <= budget for p in span):
            kept.add(s.value)
            for p in span:
                peaks[p] += held[s.value]
    return frozenset(kept)


def _phase_readers(program: Program, bounds: PhaseBounds) -> list[dict[Value, list[Task]]]:
    """Per phase, the tasks in it that read each value."""
    out: list[dict[Value, list[Task]]] = []
    for a, b in bounds.bounds:
        readers: dict[Value, list[Task]] = {}
        for task in program.tasks[a:b]:
            for value in task.reads:
                readers.setdefault(value, []).append(task)
        out.append(readers)
    return out


@dataclass
class _Moves:
    loads: list[int]
    stores: list[int]
    kept: list[int]
    largest: list[int]
    gathers: list[dict[tuple[str, ...], int]]  # per phase: gathered bytes by axes
    trip_loads: list[int]  # per phase: of `loads`, those a loop loads a slice a trip
    trips: list[int]  # per phase: the most trips of such a loop

    @classmethod
    def empty(cls, count: int) -> _Moves:
        zeros = lambda: [0] * count  # noqa: E731
        return cls(
            zeros(), zeros(), zeros(), zeros(), [{} for _ in range(count)], zeros(), [1] * count
        )


def _moves(
    program: Program,
    storages: Sequence[Storage],
    bounds: PhaseBounds,
    sharded: Sharded,
    kept: frozenset[Value],
    trips: Mapping[Value, int],
    reads: Mapping[Value, list[int]],
) -> _Moves:
    count = len(bounds.bounds)
    moves = _Moves.empty(count)
    outputs, inputs = set(program.outputs), set(program.inputs)
    readers = _phase_readers(program, bounds)
    for s in storages:
        phases = _phases_of(s, bounds)
        if not phases:
            continue
        if s.value in kept:
            last = bounds.phase_of(s.spans[-1][1])
            for p in range(phases[0] + 1, last + 1):
                moves.kept[p] += s.value.nbytes
            continue
        share = sharded.stored_bytes(s.value)
        times = trips.get(s.value, 1)  # a loop's trips each stream their own
        is_input = s.value in inputs
        for phase in phases if is_input else phases[1:]:
            moves.loads[phase] += share * times
            moves.largest[phase] = max(moves.largest[phase], share)
            readers_here = readers[phase].get(s.value, [])
            _gather(moves.gathers[phase], sharded, s.value, readers_here, times)
        if s.value in outputs or (len(phases) > 1 and not is_input):
            moves.stores[phases[0]] += share * times
            moves.largest[phases[0]] = max(moves.largest[phases[0]], share)
    _load_slices(moves, program, bounds, sharded, reads)
    return moves


def _load_slices(
    moves: _Moves,
    program: Program,
    bounds: PhaseBounds,
    sharded: Sharded,
    reads: Mapping[Value, list[int]],
) -> None:
    """The slices a phase reads of an input it reads no other way (`sliced_reads`), each
    loaded alone, as the input's share of it (split as the input is stored, gathered as it
    would be): once, or once a trip (a loop's)."""
    for value, tasks in sliced_reads(program, bounds, reads).items():
        stored = sharded.stored_bytes(value)
        for index in sorted(tasks):
            piece, times = tasks[index]
            task = program.tasks[index]
            phase = bounds.phase_of(index)
            share = piece * stored // max(1, value.nbytes)
            moves.loads[phase] += share * times
            moves.largest[phase] = max(moves.largest[phase], share)
            if times > 1:
                moves.trip_loads[phase] += share * times
                moves.trips[phase] = max(moves.trips[phase], times)
            _gather(moves.gathers[phase], sharded, value, [task], times, piece)


def _gather(
    groups: dict[tuple[str, ...], int],
    sharded: Sharded,
    value: Value,
    readers: list[Task],
    times: int = 1,
    part: int | None = None,
) -> None:
    """Adds what a phase gathers of a loaded value (as it is stored, `times` over; `part`
    bytes of it, a slice, when given) to its group of axes."""
    axes = sharded.gather_axes(value, readers)
    if axes:
        stored = sharded.narrower.get(value, value)
        ungathered = tuple(a for a in sharded.store_axes.get(stored, ()) if a not in axes)
        loaded = stored.nbytes if part is None else part * stored.nbytes // max(1, value.nbytes)
        whole = loaded // math.prod(sharded.sizes[a] for a in ungathered)
        groups[axes] = groups.get(axes, 0) + whole * times


def phase_streams(
    program: Program,
    storages: Sequence[Storage],
    bounds: PhaseBounds,
    sharded: Sharded,
    kept: frozenset[Value],
    links: LinkModel | None,
    reads: Mapping[Value, list[int]],
    trips: Mapping[Value, int] | None = None,
) -> tuple[PhaseStream, ...]:
    """Per phase: bytes loaded and stored, gathered over IPU-Links (one ring per group of
    axes, its cycles from the link model), and kept on chip; a value a loop makes anew each
    trip (`trips`) is streamed once per trip. `reads`: each storage owner's readers, as the
    storages were found (`value_uses`)."""
    moves = _moves(program, storages, bounds, sharded, kept, trips or {}, reads)
    out = []
    for p in range(len(bounds.bounds)):
        sent, cycles = 0, 0
        for axes, buffer in moves.gathers[p].items():
            assert links is not None  # gathers only happen on meshes of many IPUs
            ring = links.ring("all_gather", axes, buffer)
            sent += ring.bytes_per_ipu
            cycles += ring.link_cycles + ring.sync_cycles
        out.append(
            PhaseStream(
                moves.loads[p],
                moves.stores[p],
                sent,
                cycles,
                moves.kept[p],
                moves.largest[p],
                moves.trip_loads[p],
                moves.trips[p],
            )
        )
    return tuple(out)


def capacity_needed(
    program: Program,
    storages: Sequence[Storage],
    bounds: PhaseBounds,
    sharded: Sharded,
    kept: frozenset[Value],
    trips: Mapping[Value, int] | None = None,
) -> int:
    """The most bytes one IPU keeps in streaming memory at once: its share of every argument
    and output (both, as if nothing were updated in place), plus the activations stored between
    phases that are still to be loaded (every trip's, for a loop's), at the phase where those
    peak."""
    trips = trips or {}
    resident_values = set(program.inputs) | set(program.outputs)
    resident = 0
    count = len(bounds.bounds)
    stored = [0] * (count + 1)  # difference array over phases
    for s in storages:
        share = sharded.stored_bytes(s.value) * trips.get(s.value, 1)
        if s.value in resident_values:
            resident += share
        elif len(s.spans) > 1 and s.value not in kept:
            first = bounds.phase_of(s.spans[0][0])
            last = bounds.phase_of(s.spans[-1][0])
            stored[first] += share
            stored[last + 1] -= share
    peak, running = 0, 0
    for delta in stored[:count]:
        running += delta
        peak = max(peak, running)
    return resident + peak


def check_capacity(needed: int, target: Target) -> None:
    """Raises `OutOfMemoryError` when one IPU's streaming memory cannot hold what it keeps."""
    have = target.streaming_bytes_per_ipu
    if needed > have:
        raise OutOfMemoryError(
            f"streaming memory: each IPU needs {needed:,} bytes of streaming memory (weights, "
            f"optimizer state and activations stored between phases) but has {have:,} "
            f"(128 GB per 4-IPU machine). Remedies: more IPUs, more replicas (replicated "
            f"tensor sharding keeps 1/replicas per replica), or fewer activations kept "
            f"(jax.checkpoint)."
        )


def _window(target: Target, loads: int, stores: int, gathers: int) -> int:
    """The IO path between two phases: loads and stores at once, after the latency, then the
    gathers over IPU-Links."""
    moving = max(streaming_cycles(target, loads), streaming_cycles(target, stores))
    latency = target.streaming_latency_cycles if loads or stores else 0
    return latency + moving + gathers


def phase_costs(
    names: Sequence[str],
    compute: Sequence[int],
    streams: Sequence[PhaseStream],
    peaks: Sequence[int],
    target: Target,
) -> tuple[PhaseCost, ...]:
    """Each phase's cycles: its compute plus the exposed part of the IO window before it (this
    phase's loads and gathers, the previous phase's stores; the last phase's own stores after
    it). With IO tiles the window runs while the previous phase computes. A loop's slices
    loaded a trip at a time (`PhaseStream.trips`) come in windows of their own, the first
    before the phase and each later one while the trip before it computes (with IO tiles)."""
    out = []
    count = len(streams)
    io_tiles = target.phase_io_tiles
    for p, (name, work, stream, peak) in enumerate(
        zip(names, compute, streams, peaks, strict=True)
    ):
        previous = streams[p - 1].store_bytes if p else 0
        piece = -(-stream.trip_bytes // stream.trips)
        first = stream.load_bytes - stream.trip_bytes + piece
        moving = _window(target, first, previous, stream.gather_cycles)
        if p == count - 1 and stream.store_bytes:
            moving += _window(target, 0, stream.store_bytes, 0)
        hidden = min(moving, compute[p - 1]) if io_tiles and p > 0 else 0
        later = _window(target, piece, 0, 0) if stream.trips > 1 else 0
        later_hidden = min(later, work // stream.trips) if io_tiles else 0
        moving += (stream.trips - 1) * later
        hidden += (stream.trips - 1) * later_hidden
        out.append(
            PhaseCost(
                name=name,
                cycles=work + moving - hidden,
                streaming_bytes=stream.load_bytes + stream.store_bytes,
                peak_tile_bytes=peak,
                compute_cycles=work,
                stream_cycles=moving,
                overlapped_cycles=hidden,
                link_bytes=stream.gather_bytes,
                load_bytes=stream.load_bytes,
                store_bytes=stream.store_bytes,
                kept_bytes=stream.kept_bytes,
            )
        )
    return tuple(out)


@dataclass(frozen=True, slots=True)
class IOBuffers:
    """The IO tiles' streaming buffers: every tensor streams through them in pieces of at most
    `piece_bytes`, two in flight (one arriving while the other is copied on to the compute
    tiles), spread evenly over the `tiles` IO tiles."""

    tiles: int = 0
    bytes_per_tile: int = 0
    largest_bytes: int = 0  # the largest single tensor streamed
    pieces: int = 0  # the pieces it streams in

    @property
    def piece_bytes(self) -> int:
        return -(-self.largest_bytes // self.pieces) if self.pieces else 0

    def note(self) -> str:
        """What the buffers assume, when the largest tensor streams in pieces; else empty."""
        if self.pieces <= 1:
            return ""
        return (
            f"IO tiles: the largest tensor streamed ({self.largest_bytes:,} B) does not fit "
            f"twice on the {self.tiles} IO tiles; it streams in {self.pieces} pieces of "
            f"{self.piece_bytes:,} B, two in flight ({self.bytes_per_tile:,} B an IO tile), "
            "assumed to cost what the whole tensor does (docs/target.md, 'Streaming memory, "
            "host and phases')"
        )


NO_IO_BUFFERS = IOBuffers()  # a program without IO tiles, or nothing streamed


def io_buffers(streams: Sequence[PhaseStream], io_tiles: int, budget: int) -> IOBuffers:
    """The IO tiles' buffers as Poplar places them: two of the largest tensor streamed, spread
    over the IO tiles; when that exceeds their `budget` (bytes a tile), the tensor streams in
    the fewest equal pieces of which two fit, as a stream copy moves a tensor in parts."""
    largest = max((s.largest_bytes for s in streams), default=0)
    if not io_tiles or not largest:
        return NO_IO_BUFFERS
    pieces = max(1, -(-2 * largest // (io_tiles * budget)))
    while pieces < largest and _per_tile(largest, pieces, io_tiles) > budget:
        pieces += 1  # rounding a piece up to whole bytes can overflow the budget by a byte
    return IOBuffers(io_tiles, _per_tile(largest, pieces, io_tiles), largest, pieces)


def _per_tile(largest: int, pieces: int, io_tiles: int) -> int:
    """Bytes an IO tile holds of two pieces in flight."""
    return -(-2 * -(-largest // pieces) // io_tiles)


def io_tile_bytes(streams: Sequence[PhaseStream], io_tiles: int, budget: int) -> np.ndarray:
    """Bytes on each IO tile: its share of the streaming buffers (`io_buffers`)."""
    buffers = io_buffers(streams, io_tiles, budget)
    return np.full(buffers.tiles, buffers.bytes_per_tile, np.int64)

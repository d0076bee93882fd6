"""Streaming memory in phased programs: what each phase loads, stores and gathers, what that
costs, and whether streaming memory holds it all (docs/target.md, "Streaming memory").

An argument is loaded at the start of every phase that reads it, an output is stored at the end
of the phase that makes it, and an activation read in a later phase is stored at the end of its
own phase and loaded again where it is read. Over replica axes, replicated tensor sharding
keeps 1/replicas of each replicated tensor per replica in streaming memory and gathers the rest
over IPU-Links when it is loaded. With IO tiles, a phase's streaming hides behind the previous
phase's compute.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lowering import Value
from partitioner.cost.links import link_cycles, ring_bytes
from partitioner.errors import OutOfMemoryError
from partitioner.memory import PhaseBounds, Storage
from partitioner.program import Program
from partitioner.target import Target


@dataclass(frozen=True, slots=True)
class PhaseStream:
    """What one phase moves to and from streaming memory, per IPU."""

    load_bytes: int
    store_bytes: int
    gather_bytes: int  # replicated tensor sharding, over IPU-Links


@dataclass(frozen=True, slots=True)
class PhaseCost:
    """One phase of a phased program: its cycles (streaming not hidden by compute included),
    the bytes it moves to and from streaming memory, and its fullest tile."""

    name: str
    cycles: int
    streaming_bytes: int
    peak_tile_bytes: int
    compute_cycles: int = 0
    stream_cycles: int = 0  # loading this phase's inputs and storing its outputs
    overlapped_cycles: int = 0  # of those, hidden behind the previous phase's compute (IO tiles)
    link_bytes: int = 0  # replicated tensor sharding: the rest of each weight, over IPU-Links


@dataclass(frozen=True, slots=True)
class Replicas:
    """Replicated tensor sharding: `count` replicas (the product of the replica axes' sizes)
    share the streaming memory of the tensors in `tensors` (replicated over those axes)."""

    count: int = 1
    tensors: frozenset[Value] = frozenset()

    def share(self, value: Value) -> int:
        """The bytes of `value` one replica keeps in streaming memory."""
        return value.nbytes // self.count if value in self.tensors else value.nbytes


def streaming_cycles(target: Target, nbytes: int) -> int:
    """Moving bytes between streaming memory and one IPU, at the streaming bandwidth."""
    return math.ceil(nbytes * target.clock_hz / target.streaming_bytes_per_second) if nbytes else 0


def phase_streams(
    program: Program, storages: Sequence[Storage], bounds: PhaseBounds, replicas: Replicas
) -> tuple[PhaseStream, ...]:
    """Per phase: bytes loaded (arguments, streamed activations), stored (outputs, activations
    read after the next phase) and gathered over IPU-Links (replicated tensor sharding)."""
    count = len(bounds.bounds)
    loads, stores, gathers = [0] * count, [0] * count, [0] * count
    outputs = set(program.outputs)
    inputs = set(program.inputs)
    for s in storages:
        phases = [bounds.phase_of(a) for a, _ in s.spans]
        if not phases:
            continue
        share = replicas.share(s.value)
        is_input = s.value in inputs
        loaded = phases if is_input else phases[1:]
        for phase in loaded:
            loads[phase] += share
            if s.value in replicas.tensors and replicas.count > 1:
                gathers[phase] += ring_bytes("all_gather", s.value.nbytes, replicas.count)[0]
        if s.value in outputs or (len(phases) > 1 and not is_input):
            stores[phases[0]] += share
    return tuple(PhaseStream(*t) for t in zip(loads, stores, gathers, strict=True))


def capacity_needed(
    program: Program, storages: Sequence[Storage], bounds: PhaseBounds, replicas: Replicas
) -> int:
    """The most bytes one IPU keeps in streaming memory at once: its share of every argument
    and output (both, as if nothing were updated in place), plus the activations stored between
    phases that are still to be loaded, at the phase where those peak."""
    kept = set(program.inputs) | set(program.outputs)
    resident = 0
    count = len(bounds.bounds)
    stored = [0] * (count + 1)  # difference array over phases
    for s in storages:
        share = replicas.share(s.value)
        if s.value in kept:
            resident += share
        elif len(s.spans) > 1:
            first = bounds.phase_of(s.spans[0][0])
            last = bounds.phase_of(s.spans[-1][0])
            stored[first] += share
            stored[last + 1] -= share
    peak, running = 0, 0
    for delta in stored[:count]:
        running += delta
        peak = max(peak, running)
    return resident + peak


def check_capacity(
    program: Program,
    storages: Sequence[Storage],
    bounds: PhaseBounds,
    replicas: Replicas,
    target: Target,
) -> None:
    """Raises `OutOfMemoryError` when one IPU's streaming memory cannot hold what it keeps."""
    needed = capacity_needed(program, storages, bounds, replicas)
    have = target.streaming_bytes_per_ipu
    if needed > have:
        raise OutOfMemoryError(
            f"streaming memory: each IPU needs {needed:,} bytes of streaming memory (weights, "
            f"optimizer state and activations stored between phases) but has {have:,} "
            f"(128 GB per 4-IPU machine). Remedies: more IPUs, more replicas (replicated "
            f"tensor sharding keeps 1/replicas per replica), or fewer activations kept "
            f"(jax.checkpoint)."
        )


def phase_costs(
    names: Sequence[str],
    compute: Sequence[int],
    streams: Sequence[PhaseStream],
    peaks: Sequence[int],
    target: Target,
    replicas: Replicas,
) -> tuple[PhaseCost, ...]:
    """Each phase's cycles. Without IO tiles a phase loads, computes and stores in turn; with
    them, its loads and the previous phase's stores run while the previous phase computes, so
    only what compute does not cover is exposed. Replicated tensor sharding's gathers are a
    ring over the replicas."""
    out = []
    for p, (name, work, stream, peak) in enumerate(
        zip(names, compute, streams, peaks, strict=True)
    ):
        moving = streaming_cycles(target, stream.load_bytes + stream.store_bytes)
        if stream.gather_bytes and replicas.count > 1:
            moving += link_cycles(target, stream.gather_bytes, replicas.count - 1, False)
        hidden = min(moving, compute[p - 1]) if target.io_tiles and p > 0 else 0
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
            )
        )
    return tuple(out)


def io_tile_bytes(streams: Sequence[PhaseStream], io_tiles: int) -> np.ndarray:
    """Bytes on each IO tile: the largest phase's streamed data, split over the IO tiles."""
    if not io_tiles or not streams:
        return np.zeros(0, np.int64)
    largest = max(s.load_bytes + s.store_bytes for s in streams)
    return np.full(io_tiles, -(-largest // io_tiles), np.int64)

"""Building the cost report from what compile built.

The cycles of each superstep were fixed by the tile rules from the Target's formulas
(`partitioner.target`); this module sums them, counts FLOPs and bytes, adds the streaming of
phased programs, and lays memory out per IPU and tile.
"""

from __future__ import annotations

import math

import numpy as np

from ipujax.mesh import Mesh
from ipujax.pipeline import Built, io_tile_bytes
from ipujax.report import CollectiveCost, CostReport, PhaseCost, SuperstepCost, TileUsage
from lowering import SourceLoc
from partitioner.memory import largest_on_tile, producers_of
from partitioner.program import Program, Superstep

TOP_TILES = 5


def _matmul_dtype(program: Program) -> np.dtype:
    """The precision that sets the peak rate: that of the program's largest contraction."""
    dots = [t.op for t in program.tasks if t.op.name in ("dot_general", "convolution")]
    if not dots:
        return np.dtype(np.float32)
    return max(dots, key=lambda op: op.results[0].size).operands[0].dtype


def _top_tiles(built: Built) -> tuple[TileUsage, ...]:
    total = built.memory.total
    fullest = np.argsort(-total, kind="stable")[:TOP_TILES]
    producers = producers_of(built.program)
    return tuple(
        TileUsage(
            0,
            int(t),
            int(total[t]),
            tuple(
                largest_on_tile(
                    built.memory, built.program, built.graph, int(t), producers=producers
                )
            ),
        )
        for t in fullest
    )


def _step_cost(s: Superstep) -> SuperstepCost:
    return SuperstepCost(
        name=s.name,
        op=s.op,
        source=str(s.loc),
        tiles=s.tiles,
        flops=s.flops,
        exchange_bytes=s.exchange_bytes,
        compute_cycles=s.compute_cycles,
        exchange_cycles=s.exchange_cycles,
        sync_cycles=s.sync_cycles,
        sync_group=s.sync_group,
        link_cycles=s.link_cycles,
        kind=s.kind,
    )


def _collective(s: Superstep, mesh: Mesh) -> CollectiveCost:
    return CollectiveCost(
        kind=s.op,
        axes=s.axes,
        group_size=math.prod(mesh.shape[a] for a in s.axes),
        bytes_per_ipu=s.link_bytes,
        cycles=s.link_cycles + s.sync_cycles,
        op=s.name,
        source=str(s.loc),
        why=f"{s.why}; over {s.route}",
    )


def _supersteps(built: Built) -> list[SuperstepCost]:
    """Every superstep in order; phased, each phase is preceded by its exposed streaming."""
    if built.plan is None:
        return [_step_cost(s) for s in built.program.supersteps]
    steps = []
    for p, (a, b) in enumerate(built.plan.bounds.bounds):
        _, moving, hidden = built.phase_cycles[p]
        stream = built.streams[p]
        steps.append(
            SuperstepCost(
                name=f"{built.plan.names[p]}: stream",
                op="stream_copy",
                source=str(SourceLoc()),
                tiles=built.target.io_tiles or built.target.tiles_per_ipu,
                flops=0,
                exchange_bytes=stream.load_bytes + stream.store_bytes,
                compute_cycles=0,
                exchange_cycles=0,
                sync_cycles=0,
                sync_group="streaming",
                link_cycles=moving - hidden,
                kind="stream",
            )
        )
        steps += [_step_cost(s) for task in built.program.tasks[a:b] for s in task.supersteps]
    return steps


def _phases(built: Built) -> tuple[PhaseCost, ...]:
    if built.plan is None:
        return ()
    return tuple(
        PhaseCost(
            name=name,
            cycles=cycles,
            streaming_bytes=stream.load_bytes + stream.store_bytes,
            peak_tile_bytes=peak,
            compute_cycles=cycles - moving + hidden,
            stream_cycles=moving,
            overlapped_cycles=hidden,
            link_bytes=stream.gather_bytes,
        )
        for name, (cycles, moving, hidden), stream, peak in zip(
            built.plan.names,
            built.phase_cycles,
            built.streams,
            built.memory.phase_peaks,
            strict=True,
        )
    )


def build_report(built: Built, mesh: Mesh) -> CostReport:
    target = mesh.target
    steps = tuple(_supersteps(built))
    collectives = tuple(
        _collective(s, mesh) for s in built.program.supersteps if s.kind == "collective"
    )
    phases = _phases(built)
    io = io_tile_bytes(built, target)
    tiles = np.concatenate([built.memory.total, io]).reshape(1, -1).astype(np.int64)
    always = np.concatenate([built.memory.always_live, 0 * io]).reshape(1, -1).astype(np.int64)
    return CostReport(
        target=target.name,
        system=mesh.system.name if mesh.ipus > 1 else "single IPU",
        ipus=mesh.ipus,
        tiles_per_ipu=target.tiles_per_ipu,
        clock_hz=target.clock_hz,
        bytes_per_tile=target.bytes_per_tile,
        total_cycles=sum(s.cycles for s in steps),
        flops=sum(s.flops for s in steps),
        peak_flops_per_cycle=target.amp_flops_per_cycle(_matmul_dtype(built.program)),
        exchange_bytes=sum(s.exchange_bytes for s in steps if s.kind != "stream"),
        ipu_link_bytes=(
            sum(c.bytes_per_ipu for c in collectives) + sum(p.link_bytes for p in phases)
        )
        * mesh.ipus,
        streaming_bytes=sum(p.streaming_bytes for p in phases) * mesh.ipus,
        # Every IPU runs the same per-IPU program (SPMD), so every IPU's tiles hold the same.
        tile_memory=np.repeat(tiles, mesh.ipus, axis=0),
        always_live=np.repeat(always, mesh.ipus, axis=0),
        supersteps=steps,
        collectives=collectives,
        phases=phases,
        top_tiles=_top_tiles(built),
    )

"""Building the cost report from a scheduled program and its tile memory.

The cycles of each superstep were fixed by the tile rules from the Target's formulas
(`partitioner.target`); this module sums them, counts FLOPs and bytes, and lays memory out
per IPU and tile.
"""

from __future__ import annotations

import math

import numpy as np

from ipujax.mesh import Mesh
from ipujax.report import CollectiveCost, CostReport, SuperstepCost, TileUsage
from lowering import Graph
from partitioner.memory import TileMemory, largest_on_tile
from partitioner.program import Program


def _matmul_dtype(program: Program) -> np.dtype:
    """The precision that sets the peak rate: that of the program's largest contraction."""
    dots = [t.op for t in program.tasks if t.op.name in ("dot_general", "convolution")]
    if not dots:
        return np.dtype(np.float32)
    return max(dots, key=lambda op: op.results[0].size).operands[0].dtype


TOP_TILES = 5


def _top_tiles(program: Program, memory: TileMemory, graph: Graph) -> tuple[TileUsage, ...]:
    total = memory.total
    fullest = np.argsort(-total, kind="stable")[:TOP_TILES]
    return tuple(
        TileUsage(0, int(t), int(total[t]), tuple(largest_on_tile(memory, program, graph, int(t))))
        for t in fullest
    )


def build_report(program: Program, memory: TileMemory, mesh: Mesh, graph: Graph) -> CostReport:
    target = mesh.target
    steps = tuple(
        SuperstepCost(
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
        for s in program.supersteps
    )
    collectives = tuple(
        CollectiveCost(
            kind=s.op,
            axes=s.axes,
            group_size=math.prod(mesh.shape[a] for a in s.axes),
            bytes_per_ipu=s.link_bytes,
            cycles=s.link_cycles + s.sync_cycles,
            op=s.name,
            source=str(s.loc),
            why=f"{s.why}; over {s.route}",
        )
        for s in program.supersteps
        if s.kind == "collective"
    )
    tiles = memory.total.reshape(1, -1).astype(np.int64)
    always = memory.always_live.reshape(1, -1).astype(np.int64)
    return CostReport(
        target=target.name,
        system=mesh.system.name if mesh.ipus > 1 else "single IPU",
        ipus=mesh.ipus,
        tiles_per_ipu=target.tiles_per_ipu,
        clock_hz=target.clock_hz,
        bytes_per_tile=target.bytes_per_tile,
        total_cycles=sum(s.cycles for s in steps),
        flops=sum(s.flops for s in steps),
        peak_flops_per_cycle=target.amp_flops_per_cycle(_matmul_dtype(program)),
        exchange_bytes=sum(s.exchange_bytes for s in steps),
        ipu_link_bytes=sum(c.bytes_per_ipu for c in collectives) * mesh.ipus,
        streaming_bytes=0,
        # Every IPU runs the same per-IPU program (SPMD), so every IPU's tiles hold the same.
        tile_memory=np.repeat(tiles, mesh.ipus, axis=0),
        always_live=np.repeat(always, mesh.ipus, axis=0),
        supersteps=steps,
        collectives=collectives,
        top_tiles=_top_tiles(program, memory, graph),
    )

"""Tiles: every op of a per-IPU graph mapped onto the IPU's tiles as a task of BSP supersteps.

    context        `MappingContext`: what a tile rule may ask of the scheduler
    conv_field     the input elements a tile of a planned convolution reads, halos included
    matmul_plan    PopLibs-style search over splits of a matmul over tiles
    rules/         `TILE_RULES`, one rule per op: layouts, supersteps and a kernel
    schedule       the pass: a `Graph` on a target -> a `partitioner.program.Program`

May import: `lowering`, the base records (`target`, `errors`, `mesh`, `layout`, `program`),
`partitioner.cost`, `partitioner.memory` (a loop body's peak) and itself.
"""

"""Phased execution, as PopXL runs a program too large for the chip (docs/phases.md).

    plan           `PhasePlan`: the phases' names and task bounds, what every split produces
    loops          counted loops laid out inline, run phase-major; the runtime's rerolled
                   program
    scopes         the program's named scopes as blocks, and its tasks split by them: a phase
                   per block and direction, then optimizer phases
    blocks         blocks from the program's structure when its scopes name none: the period
                   of its tasks' signatures in each forward and backward pass
    cuts           phases cut where the fewest bytes cross (`min_crossing_cuts`)
    split          the `phases=` option (`split_phases`): by name or automatically, phases
                   fitted to the tile budget; the compute tiles and the phased hint
    rts            replicated tensor sharding: streamed tensors split over the replicas
    streaming      each phase's loads, stores and gathers from streaming memory, its capacity
                   and the IO tiles' overlap (`PhaseCost`)

May import: `lowering`, the base records, `partitioner.cost`, `partitioner.memory`,
`partitioner.tiles` (re-planning a matmul with less memory) and itself.
"""

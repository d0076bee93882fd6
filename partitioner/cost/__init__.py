"""The cost model: cycles and bytes from the Target's numbers (docs/target.md), one module per
concern. Tile rules and planners charge with these formulas while they schedule, so a plan is
chosen by what it will be charged; `summary` adds up what the schedule was charged.

    compute     matmul (AMP) and vector cycles on one tile
    exchange    on-chip exchange and sync, and sync across IPUs
    links       ring collectives over IPU-Links and Gateway-Links; where mesh axes sit
    topology    which links a group's ring runs over: ladders, the Pod64 torus, Gateway-Links
    streaming   phased programs: loads, stores and gathers per phase, capacity, overlap
    summary     one step's cost: supersteps in order, collectives, phases and totals

The modules import the records they need directly; this package itself imports nothing, so
that the schedule's records (`partitioner.program`) may refer to `links.CollectiveCost`.
"""

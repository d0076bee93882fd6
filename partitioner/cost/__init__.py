"""The cost model's leaf formulas: cycles and bytes from the Target's numbers (docs/target.md),
one module per concern, pure functions of the Target and the system. Tile rules and planners
charge with them while they schedule, so a plan is chosen by what it will be charged; the
summaries above the schedule (`partitioner.step`, `phases.streaming`, `pipelines.schedule`) only
add up what the schedule was charged.

    amp         the AMP vertex a matmul or convolution runs on a tile, its partials' reduction
    vector      every elementwise op's popops vertex: unary, binary, cast, reduce cycles
    copies      rearranging copies, transposes, slices and fills on a tile
    compute     the AMP peak, for FLOP utilisation
    exchange    on-chip exchange and sync, and sync across IPUs
    topology    which links a group's ring runs over: ladders, the Pod64 torus, Gateway-Links
    links       ring collectives over those links; where mesh axes sit (`LinkModel`)
    linalg      PopLibs' blocked factorisations' vertices and the FFT's butterflies (A rates)
    callbacks   a host callback's round trip to the host

May import: `lowering`, `partitioner.target`, `partitioner.mesh`, and itself; nothing above.
"""

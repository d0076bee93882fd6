"""Sharding: from the user's specs to the program each IPU runs, with its collectives.

    specs          `Sharding` (per dimension the mesh axes it is split over, plus pending-sum
                   axes), `from_spec`, `user_shardings`
    factors        the factor record every rule returns, and its projection onto a tensor
    factor_rules   per op, Shardy-style factors: which dimensions correspond, which reduce
    conv_factors   the convolution's factors; a grouped one's groups split in whole groups
    propagation    forward and backward sweeps to a fixed point, conflicts in a fixed order
    explain        where each sharding came from (`Compiled.explain()`)
    builder        emits the per-IPU ops and the resharding between them
    partition      the global graph rewritten for per-IPU shapes, collectives inserted, loops
                   partitioned as loops
    pending        which ops keep a partial sum pending (one collective later, not one now)
    halo, halo_rewrite  a split dim read at an offset: neighbours' edge rows exchanged
    replicas       the replica axes, and the axes each per-IPU value varies over
    combine        all-reduces held back and merged into buffers, as Graphcore's combiner does

May import: `lowering`, `partitioner.errors`, `partitioner.mesh`, and itself. It knows nothing
of tiles, memory or cost: its output is a per-IPU `lowering.Graph`.
"""

"""The step's cost, above the schedule: what the schedule charged, gathered and added up.

    host           the step's inputs from and results to the host, as supersteps
    prefetch       which host transfers overlap compute: a loop's slices prefetched trip
                   by trip, a phased program's IO tiles
    summary        `StepCost`: the supersteps in order, collectives, phases and totals
    trips          loops whose cost rests on an assumption (trips only a run knows, or past
                   the unroll limit), and the step re-summed with the trips a run counted

May import: `lowering`, the base records, `partitioner.cost`, `partitioner.memory`,
`partitioner.phases` (`PhaseCost`), `partitioner.tiles` (a loop's trips) and itself.
"""

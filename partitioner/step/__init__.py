"""The step's cost, above the schedule: what the schedule charged, gathered and added up.

    host           the step's inputs from and results to the host, as supersteps
    summary        `StepCost`: the supersteps in order, collectives, phases and totals

May import: `lowering`, the base records, `partitioner.cost`, `partitioner.memory`,
`partitioner.phases` (`PhaseCost`) and itself.
"""

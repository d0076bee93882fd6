"""Pipeline parallelism as Graphcore ran it: stages over a mesh axis, micro-batches flowing
through them, gradients accumulated and the weights updated once per step.

    pipeline       `Pipeline`, the user's request checked; the stages' count along its axis,
                   and the mesh of one stage's IPUs (`without_axis`)
    microbatch     which tasks run once per micro-batch, which once per step (`MICROBATCH`)
    stages         each task's stage and kind (`StageSplit`, `split_stages`, `balanced_stages`)
    stage_program  each stage's own program, in the order its IPU runs it
    recompute      recomputation: a stage's forward run again block by block in its backward,
                   its checkpoints (`recomputed`, `checkpoints`)
    stage_memory   each stage's memory: liveness plus the stash of the micro-batches in flight;
                   stages over budget re-planned (`fit_stages`)
    stage_fit      a floor under the fullest tile from the stashes alone (`stash_floor`), and
                   `fit_stages` run only when the stages' memory, swept first, is over
    stage_costs    each stage's cycles per micro-batch and per step, and its traffic
    schedule       the pipeline's cycles: fill, steady state and drain (`PipelineCost`)
    step_cost      the step's cost as the report reads it (`pipelined_step_cost`)

May import: `lowering`, the base records, `partitioner.cost`, `partitioner.memory`,
`partitioner.sharding` (propagation of the micro-batch axis), `partitioner.tiles`,
`partitioner.phases` (blocks by scope), `partitioner.step` and itself.
"""

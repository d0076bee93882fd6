"""The partitioner's passes, in order, in one place: from a lowered graph on a mesh to the
per-IPU BSP program with its memory and its cost.

    unroll         (pipelined) counted loops unrolled, so that stages can cut a scan's layers
    partition      (mesh of many IPUs) user specs -> shardings -> propagation -> the per-IPU
                   program with collectives, loops partitioned as loops; verified when asked
    combine        (unphased) all-reduces over the same axes held back and merged, up to a
                   buffer of bytes, as Graphcore's TensorFlow and XLA combine them
    simplify       reductions over dimensions of one element as reshapes, as XLA's
                   simplifier makes them (`lowering.unit_reductions`)
    fuse           chains of elementwise ops as one `fusion` op each, one map expression
                   per tile (`lowering.fusion`), as Poplar's XLA backend runs them, and
                   sibling reductions of one tensor as one (`lowering.siblings`)
    place axes     mesh axes onto physical IPUs, the last axis innermost
    schedule       tile layouts, kernels and supersteps on the compute tiles
    replicas       the replica axes, derived from the shardings (or given)
    split phases   (phases=...) counted loops laid out inline to run phase-major; a forward
                   and a backward phase per block, optimizer phases; tasks reordered phase by
                   phase
    shard          (phased, many IPUs) replicated tensor sharding: streamed tensors split over
                   the axes they are replicated over, gradients reduce-scattered, updates on
                   shards
    memory         per-tile bytes by liveness, phase-aware; activations that fit stay on chip;
                   OutOfMemoryError if over
    streaming      per-phase loads, stores and gathers; streaming memory's capacity
    combine in phases  (phased, many IPUs) the all-reduces of a phase that can run at one
                   point charged as one ring (`phases.combine`)
    host           the step's inputs from and results to the host
    cost           the step's supersteps, collectives, phases and totals

Each pass is a pure function of what the earlier ones made. `ipujax` calls `build`, then builds
the runtime and the report from what it returns. A pipelined build's passes up to its stage
split are `staged_program`'s, which a `reuse.reusing` block (the plan search's) keeps for the
builds that differ only after it (stashing or recomputing), and which bound its memory from
below before the rest runs (`pipeline_peak_floor`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from jax.sharding import PartitionSpec

from lowering import (
    Graph,
    Value,
    fuse_elementwise,
    reshape_unit_reductions,
    unroll_loops,
    verify,
)
from partitioner.cost.exchange import global_sync_cycles
from partitioner.cost.links import LinkModel
from partitioner.errors import OutOfMemoryError
from partitioner.memory.check import check_memory
from partitioner.memory.liveness import with_kept, with_ways
from partitioner.memory.tiles import TileMemory, tile_memory
from partitioner.mesh import Mesh
from partitioner.phases.combine import combine_in_phases
from partitioner.phases.loops import per_trip, rerolled
from partitioner.phases.plan import PhasePlan, Phases
from partitioner.phases.rts import Sharded, shard_phases, unsharded
from partitioner.phases.split import Fitted, compute_target, phased_hint, split_phases
from partitioner.phases.streaming import (
    PhaseStream,
    capacity_needed,
    check_capacity,
    keep_on_chip,
    phase_streams,
)
from partitioner.pipelines.microbatch import per_microbatch
from partitioner.pipelines.pipeline import Pipeline, pipeline_stages, without_axis
from partitioner.pipelines.schedule import PipelineCost, schedule_pipeline
from partitioner.pipelines.stage_costs import stage_costs
from partitioner.pipelines.stage_fit import PeakFloor, fitted_stages, stash_floor
from partitioner.pipelines.stages import StageSplit, split_stages
from partitioner.pipelines.step_cost import pipelined_step_cost
from partitioner.program import Program
from partitioner.reuse import kept
from partitioner.sharding.combine import BUFFER_BYTES, combine_all_reduces
from partitioner.sharding.manual import inline_on_one_ipu
from partitioner.sharding.partition import Partitioned, partition
from partitioner.sharding.propagation import propagate_shardings
from partitioner.sharding.replicas import check_replica_axes, derive_replica_axes, varying_axes
from partitioner.sharding.specs import user_shardings
from partitioner.step.host import host_io, step_transfers
from partitioner.step.summary import StepCost, program_cost
from partitioner.target import Target
from partitioner.tiles.schedule import schedule
from partitioner.verify import verify_memory, verify_program, verify_storages, verify_uses


@dataclass(frozen=True, slots=True)
class Options:
    """How to build: `phases` (None, "auto" or `jax.named_scope` names), the replica axes (None:
    derived from the shardings), whether to check tile and streaming memory, and whether to
    verify each per-IPU graph's IR and, after every pass that makes or changes the BSP program
    or its memory, the program's invariants (`partitioner.verify`; a debug aid, on in the
    tests and with `ipujax.jit(verify=True)`)."""

    phases: Phases = None
    replica_axes: tuple[str, ...] | None = None
    check_memory: bool = True
    verify: bool = False
    collective_buffer_bytes: int = BUFFER_BYTES  # the combiner's; 0 keeps collectives apart
    pipeline: Pipeline | None = None  # stages over a mesh axis (the program is a micro-batch's)
    batch_inputs: tuple[int, ...] = ()  # with a pipeline: the inputs that carry the batch
    resident_inputs: tuple[int, ...] = ()  # inputs kept on the IPUs between steps, never sent
    fuse: bool = True  # elementwise chains fused, as Poplar runs them (False: op by op)


@dataclass(frozen=True, eq=False)
class Built:
    """What `build` makes: the per-IPU program, its memory, phases and cost."""

    mesh: Mesh
    graph: Graph  # the program each IPU runs
    partitioned: Partitioned | None  # None on one IPU
    target: Target  # the compute tiles' target (fewer tiles when IO tiles stream)
    program: Program
    plan: PhasePlan | None
    memory: TileMemory
    replica_axes: tuple[str, ...]
    streams: tuple[PhaseStream, ...]
    cost: StepCost
    kept: frozenset = frozenset()  # activations kept on chip across phases
    pipeline: PipelineCost | None = None  # pipelined: the stages and their schedule
    stage_memories: tuple[TileMemory, ...] = ()  # pipelined: each stage's IPU, in stage order
    stage_programs: tuple[Program, ...] = ()  # pipelined: the tasks each stage's memory sweeps

    @property
    def runnable(self) -> Program:
        """The program the runtime runs: `program`, its loops laid out inline for the phases
        (`phases.loops`) run as the loops they are."""
        return self.program if self.plan is None else rerolled(self.program, self.plan.loops)


def partition_program(
    graph: Graph,
    mesh: Mesh,
    in_specs: Sequence[PartitionSpec | None],
    out_specs: Sequence[PartitionSpec | None],
) -> Partitioned:
    """The user's specs as shardings, propagated, and the per-IPU program they make."""
    inputs, outputs = user_shardings(graph, mesh.shape, in_specs, out_specs)
    fixed_outputs = {graph.outputs[i]: s for i, s in outputs.items()}
    propagated = propagate_shardings(graph, inputs, fixed_outputs)
    return partition(graph, propagated, mesh.shape, outputs)


def per_ipu(
    graph: Graph,
    mesh: Mesh,
    in_specs: Sequence[PartitionSpec | None],
    out_specs: Sequence[PartitionSpec | None],
    combine_bytes: int,
    options: Options,
) -> tuple[Partitioned | None, Graph]:
    """The program each IPU of `mesh` runs: partitioned on many IPUs, its all-reduces combined
    up to `combine_bytes` (0: kept apart), its elementwise chains fused (`options.fuse`), its
    IR verified when `options.verify`."""
    partitioned = None
    local = graph if mesh.ipus > 1 else inline_on_one_ipu(graph)
    if mesh.ipus > 1:
        partitioned = partition_program(graph, mesh, in_specs, out_specs)
        local = combine_all_reduces(partitioned.graph, combine_bytes)
    local = reshape_unit_reductions(local)
    if options.fuse:
        # phases and pipeline stages are cut between ops: fusions stay within a line of source
        split = options.phases is not None or options.pipeline is not None
        local = fuse_elementwise(local, by_source=split)
    if options.verify:
        verify(local)
    return partitioned, local


def checked(program: Program, after: str, mesh: Mesh, options: Options) -> Program:
    """`program` as pass `after` made it, its BSP invariants verified when `options.verify`."""
    if options.verify:
        verify_program(program, after, mesh.shape)
    return program


def checked_memory(memory: TileMemory, after: str, options: Options) -> TileMemory:
    if options.verify:
        verify_memory(memory, after)
    return memory


def place_axes(partitioned: Partitioned | None, mesh: Mesh) -> LinkModel | None:
    """Mesh axes onto physical IPUs in the mesh's order, the last axis innermost."""
    if partitioned is None:
        return None
    return LinkModel.place(mesh.shape, mesh.target, mesh.system)


def replica_axes_of(
    partitioned: Partitioned | None, mesh: Mesh, given: Sequence[str] | None
) -> tuple[str, ...]:
    if given is not None:
        return check_replica_axes(given, mesh.shape)
    if partitioned is None:
        return ()
    graph = partitioned.global_graph
    return derive_replica_axes(graph, partitioned.input_shardings, mesh.axis_names)


def check_fits(
    memory: TileMemory, program: Program, graph: Graph, target: Target, phased: bool
) -> None:
    """Raises `OutOfMemoryError` for a tile over budget; unphased, says whether phases would fit."""
    try:
        check_memory(memory, program, graph, target)
    except OutOfMemoryError as error:
        if phased:
            raise
        raise OutOfMemoryError(f"{error}\n{phased_hint(program, target)}") from None


def shard(
    program: Program,
    plan: PhasePlan | None,
    partitioned: Partitioned | None,
    mesh: Mesh,
    axes: Sequence[str],
    links: LinkModel | None,
) -> Sharded:
    """Replicated tensor sharding of a phased program on many IPUs."""
    if plan is None or partitioned is None or links is None:
        return unsharded(program)
    varying = varying_axes(partitioned.graph, partitioned.input_shardings)
    return shard_phases(program, varying, mesh.shape, axes, links)


def phased_memory(
    program: Program,
    plan: PhasePlan | None,
    sharded: Sharded,
    target: Target,
    trips: Mapping[Value, int],
    fitted: Fitted | None,
) -> tuple[TileMemory, frozenset]:
    """Tile memory; phased, with the activations that fit kept on chip across phases (each a
    loop's trips make anew, `trips`, holding every trip's copy); `fitted` is the phase split's
    fitting of the program (its value uses and storages in its phases)."""
    if plan is None or fitted is None:
        return tile_memory(program, target), frozenset()
    uses = fitted.uses
    ways = dict.fromkeys(sharded.shard_values, sharded.replicas)
    stored = with_ways(fitted.memory.storages, ways)
    first = tile_memory(program, target, plan.bounds, ways=ways, uses=uses, stored=stored)
    kept = keep_on_chip(
        program,
        first.storages,
        plan.bounds,
        first.phase_peaks,
        target.bytes_per_tile,
        trips,
    )
    if not kept:
        return first, kept
    stored = with_kept(first.storages, kept, plan.bounds, uses)
    return tile_memory(program, target, plan.bounds, kept, ways, uses, stored), kept


def build(
    graph: Graph,
    mesh: Mesh,
    in_specs: Sequence[PartitionSpec | None],
    out_specs: Sequence[PartitionSpec | None],
    options: Options = Options(),
) -> Built:
    """The per-IPU program of `graph` on `mesh`, scheduled, phased, its memory checked and its
    cost summed."""
    if options.pipeline is not None:
        return build_pipelined(graph, mesh, in_specs, out_specs, options)
    # Phased programs skip the combiner: replicated tensor sharding splits each gradient's.
    combine = options.collective_buffer_bytes if options.phases is None else 0
    partitioned, local = per_ipu(graph, mesh, in_specs, out_specs, combine, options)
    links = place_axes(partitioned, mesh)
    target = compute_target(mesh.target, options.phases)
    program = checked(schedule(local, target, links), "schedule", mesh, options)
    io = host_io(local, options.resident_inputs, graph)
    program = dataclasses.replace(program, on_device=frozenset(local.inputs) - set(io.inputs or ()))
    axes = replica_axes_of(partitioned, mesh, options.replica_axes)
    # The split's value uses and storages hold after sharding, which re-costs supersteps only.
    program, plan, fitted = split_phases(program, options.phases, target)
    program = checked(program, "split phases", mesh, options)
    sharded = shard(program, plan, partitioned, mesh, axes, links)
    program = checked(sharded.program, "shard", mesh, options)
    if options.verify and plan is not None and fitted is not None:
        verify_uses(fitted.uses, program, plan.bounds, "shard")
        verify_storages(fitted.memory.storages, program, plan.bounds, fitted.uses, "shard")
    trips = per_trip(program, plan.bounds, plan.loops) if plan is not None else {}
    memory, kept = phased_memory(program, plan, sharded, target, trips, fitted)
    checked_memory(memory, "memory", options)
    if options.check_memory:
        check_fits(memory, program, local, target, plan is not None)
    streams: tuple[PhaseStream, ...] = ()
    if plan is not None and fitted is not None:
        if options.check_memory:
            needed = capacity_needed(program, memory.storages, plan.bounds, sharded, kept, trips)
            check_capacity(needed, mesh.target)
        reads = fitted.uses[1]
        streams = phase_streams(
            program, memory.storages, plan.bounds, sharded, kept, links, reads, trips
        )
        program = _combined_in_phases(program, plan, links, mesh, options)
    host = step_transfers(io, program, mesh, target, plan is not None)
    cost = program_cost(program, plan, memory.phase_peaks, streams, target, host)
    return Built(mesh, local, partitioned, target, program, plan, memory, axes, streams, cost, kept)


def _combined_in_phases(
    program: Program, plan: PhasePlan, links: LinkModel | None, mesh: Mesh, options: Options
) -> Program:
    """The phases' all-reduces that can run at one point charged as one ring."""
    if links is None:
        return program
    combined = combine_in_phases(program, plan.bounds, links, options.collective_buffer_bytes)
    return checked(combined, "combine in phases", mesh, options)


@dataclass(frozen=True, eq=False)
class StagedProgram:
    """What a pipelined build makes before the pipeline's micro-batch count, recomputation
    and off-chip optimizer state matter: the micro-batch's program partitioned over the mesh
    without the pipeline axis, scheduled, and split into stages."""

    partitioned: Partitioned | None
    local: Graph
    program: Program
    replica_axes: tuple[str, ...]
    split: StageSplit


def staged_program(
    graph: Graph,
    mesh: Mesh,
    in_specs: Sequence[PartitionSpec | None],
    out_specs: Sequence[PartitionSpec | None],
    options: Options,
) -> StagedProgram:
    """A micro-batch's program partitioned over the mesh without the pipeline axis
    (collectives costed where their axes lie on the whole mesh), scheduled and split into
    stages; inside `reuse.reusing`, made once for every build that differs only in what the
    passes after the split read (`_after_split`)."""
    key = ("staged", id(graph), mesh, tuple(in_specs), tuple(out_specs), _after_split(options))
    return kept(key, (graph,), lambda: _staged(graph, mesh, in_specs, out_specs, options))


def _after_split(options: Options) -> Hashable:
    """`options` with what only the passes after the stage split read set to one value: the
    memory check, and the pipeline's micro-batches, recomputation, off-chip state and batch
    arguments (the program is one micro-batch's; `options.batch_inputs` says which inputs
    carry the batch)."""
    pipe = options.pipeline
    assert pipe is not None
    alike = dataclasses.replace(
        pipe, microbatches=1, recompute=False, batch_argnums=None, optimizer_state_offchip=False
    )
    return dataclasses.replace(options, check_memory=True, pipeline=alike)


def _staged(
    graph: Graph,
    mesh: Mesh,
    in_specs: Sequence[PartitionSpec | None],
    out_specs: Sequence[PartitionSpec | None],
    options: Options,
) -> StagedProgram:
    pipe = options.pipeline
    assert pipe is not None
    count = pipeline_stages(pipe, mesh)
    rest = without_axis(mesh, pipe.axis)
    # Not combined: a combined all-reduce would join gradients of different stages, which live
    # on different IPUs.
    partitioned, local = per_ipu(unroll_loops(graph), rest, in_specs, out_specs, 0, options)
    links = LinkModel.place(mesh.shape, mesh.target, mesh.system) if mesh.ipus > 1 else None
    program = checked(schedule(local, mesh.target, links), "schedule", mesh, options)
    axes = replica_axes_of(partitioned, rest, options.replica_axes)
    split = split_stages(program, pipe, count, per_microbatch(local, options.batch_inputs))
    return StagedProgram(partitioned, local, program, axes, split)


def pipeline_peak_floor(
    graph: Graph,
    mesh: Mesh,
    in_specs: Sequence[PartitionSpec | None],
    out_specs: Sequence[PartitionSpec | None],
    options: Options,
) -> PeakFloor:
    """A floor under the fullest tile `build` reports for a pipelined step, from its staged
    program alone (which a `reuse.reusing` block keeps for the build): the most any stage
    stashes on one tile (`stage_fit.stash_floor`)."""
    pipe = options.pipeline
    assert pipe is not None
    staged = staged_program(graph, mesh, in_specs, out_specs, options)
    return stash_floor(staged.program, staged.split, pipe, mesh.target)


def build_pipelined(
    graph: Graph,
    mesh: Mesh,
    in_specs: Sequence[PartitionSpec | None],
    out_specs: Sequence[PartitionSpec | None],
    options: Options,
) -> Built:
    """The micro-batch's staged program (`staged_program`), each stage's memory checked on its
    IPU (matmuls re-planned where a stage is over), and the pipeline's cycles."""
    pipe = options.pipeline
    assert pipe is not None
    staged = staged_program(graph, mesh, in_specs, out_specs, options)
    count, split, local, target = staged.split.stages, staged.split, staged.local, mesh.target
    program, stages, memories = fitted_stages(staged.program, split, pipe, target)
    program = checked(program, "fit stages", mesh, options)
    for s, (stage, memory) in enumerate(zip(stages, memories, strict=True)):
        checked_memory(memory, f"stage {s} memory", options)
        if options.check_memory:
            check_memory(memory, stage, local, target, ipu=s)
    costs = stage_costs(program, split, pipe, target, memories)
    schedule_ = schedule_pipeline(
        costs, pipe.microbatches, target, global_sync_cycles(target, count), pipe.axis
    )
    cost = pipelined_step_cost(schedule_, program, split, target)
    fullest = max(range(count), key=lambda s: costs[s].peak_tile_bytes)
    return Built(
        mesh,
        local,
        staged.partitioned,
        target,
        program,
        None,
        memories[fullest],
        staged.replica_axes,
        (),
        cost,
        pipeline=schedule_,
        stage_memories=tuple(memories),
        stage_programs=tuple(stages),
    )

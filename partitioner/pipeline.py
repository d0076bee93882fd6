"""The partitioner's passes, in order, in one place: from a lowered graph on a mesh to the
per-IPU BSP program with its memory and its cost.

    partition      (mesh of many IPUs) user specs -> shardings -> propagation -> the per-IPU
                   program with collectives; verified when asked
    place axes     mesh axes onto physical IPUs by the bytes their collectives move
    schedule       tile layouts, kernels and supersteps on the compute tiles
    split phases   (phases=...) phases; tasks reordered for named phases
    memory         per-tile bytes by liveness, phase-aware; OutOfMemoryError if over
    replicas       the replica axes, derived from the shardings (or given)
    streaming      per-phase loads, stores and replicated tensor sharding's gathers
    cost           the step's supersteps, collectives, phases and totals

Each pass is a pure function of what the earlier ones made. `ipujax` calls `build`, then builds
the runtime and the report from what it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jax.sharding import PartitionSpec

from lowering import Graph, verify
from partitioner.cost.links import LinkModel, axis_traffic
from partitioner.cost.streaming import (
    PhaseStream,
    Replicas,
    check_capacity,
    phase_costs,
    phase_streams,
)
from partitioner.cost.summary import StepCost, step_cost
from partitioner.errors import OutOfMemoryError
from partitioner.memory import TileMemory, check_memory, tile_memory
from partitioner.mesh import Mesh
from partitioner.partition import Partitioned, partition
from partitioner.phases import PhasePlan, compute_target, phased_hint, split_phases
from partitioner.program import Program
from partitioner.propagation import propagate_shardings
from partitioner.replicas import check_replica_axes, derive_replica_axes, replicas_of
from partitioner.schedule import schedule
from partitioner.sharding import user_shardings
from partitioner.target import Target


@dataclass(frozen=True, slots=True)
class Options:
    """How to build: `phases` (None, "auto" or `jax.named_scope` names), the replica axes (None:
    derived from the shardings), whether to check tile and streaming memory, and whether to
    verify the per-IPU program's IR (a debug aid; tests turn it on)."""

    phases: Any = None
    replica_axes: tuple[str, ...] | None = None
    check_memory: bool = True
    verify: bool = False


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


def place_axes(partitioned: Partitioned | None, mesh: Mesh) -> LinkModel | None:
    """Mesh axes onto physical IPUs, the busiest innermost."""
    if partitioned is None:
        return None
    traffic = axis_traffic(partitioned.graph)
    return LinkModel.place(mesh.shape, traffic, mesh.target, mesh.system)


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


def stream_phases(
    program: Program,
    plan: PhasePlan | None,
    memory: TileMemory,
    replicas: Replicas,
    target: Target,
    check: bool,
) -> tuple[PhaseStream, ...]:
    if plan is None:
        return ()
    if check:
        check_capacity(program, memory.storages, plan.bounds, replicas, target)
    return phase_streams(program, memory.storages, plan.bounds, replicas)


def cost_step(
    program: Program,
    plan: PhasePlan | None,
    memory: TileMemory,
    streams: Sequence[PhaseStream],
    replicas: Replicas,
    target: Target,
) -> StepCost:
    if plan is None:
        return step_cost(program, None, (), target)
    compute = [
        sum(step.cycles for task in program.tasks[a:b] for step in task.supersteps)
        for a, b in plan.bounds.bounds
    ]
    phases = phase_costs(plan.names, compute, streams, memory.phase_peaks, target, replicas)
    return step_cost(program, plan.bounds, phases, target)


def build(
    graph: Graph,
    mesh: Mesh,
    in_specs: Sequence[PartitionSpec | None],
    out_specs: Sequence[PartitionSpec | None],
    options: Options = Options(),
) -> Built:
    """The per-IPU program of `graph` on `mesh`, scheduled, phased, its memory checked and its
    cost summed."""
    partitioned = None
    local = graph
    if mesh.ipus > 1:
        partitioned = partition_program(graph, mesh, in_specs, out_specs)
        local = partitioned.graph
        if options.verify:
            verify(local)
    links = place_axes(partitioned, mesh)
    target = compute_target(mesh.target, options.phases)
    program = schedule(local, target, links)
    program, plan = split_phases(program, options.phases, target)
    memory = tile_memory(program, target, plan.bounds if plan else None)
    if options.check_memory:
        check_fits(memory, program, local, target, plan is not None)
    axes = replica_axes_of(partitioned, mesh, options.replica_axes)
    replicas = replicas_of(partitioned, axes, mesh.shape)
    streams = stream_phases(program, plan, memory, replicas, mesh.target, options.check_memory)
    cost = cost_step(program, plan, memory, streams, replicas, target)
    return Built(mesh, local, partitioned, target, program, plan, memory, axes, streams, cost)

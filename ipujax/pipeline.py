"""The compile pipeline, every pass in order, in one place.

    (at lower: trace and import, then eliminate_dead_code)
partition      (mesh of many IPUs) shardings -> per-IPU program with collectives
place axes     mesh axes onto physical IPUs by the bytes their collectives move
schedule       tile layouts, kernels and supersteps on the compute tiles
split phases   (phases=...) phases, tasks reordered for named phases
memory         per-tile bytes by liveness, phase-aware; OutOfMemoryError if over
streaming      per-phase loads, stores and replicated-tensor-sharding gathers
runtime        one jitted function of the flat inputs, on one device or spread over several
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec

from ipujax.devices import default_device, plan_devices
from ipujax.mesh import Mesh
from ipujax.runtime import Runner, compile_partitioned, compile_program
from ipujax.sharded import axis_traffic, partition_program
from lowering import Graph, Value
from partitioner.errors import ConfigError, OutOfMemoryError
from partitioner.links import LinkModel
from partitioner.memory import TileMemory, check_memory, tile_memory
from partitioner.partition import Partitioned
from partitioner.phases import (
    PhasePlan,
    PhaseStream,
    phase_summary,
    split_auto,
    split_by_names,
    streaming,
    streaming_capacity_needed,
)
from partitioner.program import Program
from partitioner.schedule import schedule
from partitioner.target import Target


@dataclass(frozen=True, eq=False)
class Built:
    """Everything compile makes: the per-IPU program, its memory and phases, the runner."""

    graph: Graph  # the program each IPU runs
    program: Program
    memory: TileMemory
    target: Target  # the target of the compute tiles
    run: Runner
    partitioned: Partitioned | None
    plan: PhasePlan | None
    streams: tuple[PhaseStream, ...]
    phase_cycles: tuple[tuple[int, int, int], ...]
    devices: tuple[jax.Device, ...]  # the real jax devices the runner uses


def _compute_target(target: Target, phases: Any) -> Target:
    if phases is None or not target.io_tiles:
        return target
    if target.io_tiles >= target.tiles_per_ipu:
        raise ConfigError(
            f"io_tiles={target.io_tiles} leaves no compute tiles of {target.tiles_per_ipu}; "
            "use fewer IO tiles"
        )
    return target.with_tiles(target.tiles_per_ipu - target.io_tiles)


def _split(program: Program, phases: Any, target: Target) -> tuple[Program, PhasePlan | None]:
    if phases is None or phases == "none":
        return program, None
    if phases == "auto":
        return program, split_auto(program, target)
    if isinstance(phases, (list, tuple)) and phases and all(isinstance(n, str) for n in phases):
        try:
            return split_by_names(program, phases)
        except ValueError as error:
            raise ConfigError(
                f"phases={list(phases)}: {error}; wrap each phase's code in "
                "jax.named_scope(name), or use phases='auto'"
            ) from None
    raise ConfigError(
        f"phases={phases!r} is not understood; use None, 'auto' or a list of jax.named_scope names"
    )


def _replicated_over_dp(graph: Graph, partitioned: Partitioned | None, mesh: Mesh) -> set[Value]:
    """Tensors replicated over a `dp` axis (weights, optimizer state, reduced gradients), which
    replicated tensor sharding splits: each replica keeps 1/dp of them in streaming memory."""
    if "dp" not in mesh.shape or partitioned is None:
        return set()
    pairs = [
        *zip(graph.inputs, partitioned.input_shardings, strict=True),
        *zip(graph.outputs, partitioned.output_shardings, strict=True),
        *partitioned.local_shardings.items(),
    ]
    return {local for local, sharding in pairs if "dp" not in sharding.axes}


def _check_streaming(
    program: Program, memory: TileMemory, mesh: Mesh, rts: set[Value], plan: PhasePlan
) -> None:
    replicas = mesh.shape.get("dp", 1)
    needed = streaming_capacity_needed(program, replicas, rts, memory.storages, plan)
    have = mesh.target.streaming_bytes_per_ipu
    if needed > have:
        raise OutOfMemoryError(
            f"streaming memory: each IPU needs {needed:,} bytes of streaming memory (weights, "
            f"optimizer state and activations stored between phases) but has {have:,} "
            f"(128 GB per 4-IPU machine). Remedies: more IPUs, a dp axis (replicated tensor "
            f"sharding keeps 1/dp per replica), or fewer activations kept (jax.checkpoint)."
        )


def build(
    graph: Graph,
    mesh: Mesh,
    in_specs: Sequence[PartitionSpec | None],
    out_specs: Sequence[PartitionSpec | None],
    phases: Any,
    donate: Sequence[int],
    check_memory_fits: bool,
    devices: Sequence[jax.Device] | None = None,
) -> Built:
    partitioned = None
    links = None
    local = graph
    if mesh.ipus > 1:
        partitioned = partition_program(graph, mesh, in_specs, out_specs)
        local = partitioned.graph
        links = LinkModel.place(mesh.shape, axis_traffic(local), mesh.target)
    target = _compute_target(mesh.target, phases)
    program = schedule(local, target, links)
    program, plan = _split(program, phases, target)
    memory = tile_memory(program, target, plan.bounds if plan else None)
    if check_memory_fits:
        _check_fits(memory, program, local, target, plan)
    streams: list[PhaseStream] = []
    cycles: list[tuple[int, int, int]] = []
    if plan is not None:
        rts = _replicated_over_dp(local, partitioned, mesh)
        if check_memory_fits:
            _check_streaming(program, memory, mesh, rts, plan)
        streams = streaming(program, memory.storages, plan, mesh.shape.get("dp", 1), rts)
        cycles = _phase_cycles(program, plan, streams, target, links)
    run, used = _runner(program, partitioned, mesh, donate, devices)
    return Built(
        local, program, memory, target, run, partitioned, plan, tuple(streams), tuple(cycles), used
    )


def _runner(
    program: Program,
    partitioned: Partitioned | None,
    mesh: Mesh,
    donate: Sequence[int],
    devices: Sequence[jax.Device] | None,
) -> tuple[Runner, tuple[jax.Device, ...]]:
    """The jitted runner and the real devices it uses: the mesh spread over `devices` (by
    default every device jax sees) where its axes divide, else one device as before."""
    pool = tuple(jax.devices() if devices is None else devices)
    if not pool:
        raise ConfigError("devices is empty: give at least one jax device, or None for all")
    spread = None
    if partitioned is None:
        run = compile_program(program, donate)
    else:
        spread = plan_devices(partitioned, mesh.axis_names, mesh.shape, pool)
        run = compile_partitioned(program, partitioned, mesh.axis_names, mesh.shape, donate, spread)
    if spread is not None:
        return run, spread.devices
    # One device: jax's default, exactly as before, unless the caller named another.
    default = default_device()
    device = default if devices is None else pool[0]
    if device == default:
        return run, (device,)
    return dataclasses.replace(run, device=device), (device,)


def _phase_cycles(
    program: Program,
    plan: PhasePlan,
    streams: list[PhaseStream],
    target: Target,
    links: LinkModel | None,
) -> list[tuple[int, int, int]]:
    compute = [
        sum(step.cycles for task in program.tasks[a:b] for step in task.supersteps)
        for a, b in plan.bounds.bounds
    ]
    gathers = {}
    if links is not None and "dp" in links.sizes:
        for p, s in enumerate(streams):
            if s.gather_bytes:
                steps = links.sizes["dp"] - 1
                gathers[p] = target.link_cycles(s.gather_bytes, steps, False)
    return phase_summary(plan, compute, streams, target, gathers)


def _check_fits(
    memory: TileMemory, program: Program, graph: Graph, target: Target, plan: PhasePlan | None
) -> None:
    try:
        check_memory(memory, program, graph, target)
    except OutOfMemoryError as error:
        if plan is not None:
            raise
        raise OutOfMemoryError(f"{error}\n{_phased_hint(program, target)}") from None


def _phased_hint(program: Program, target: Target) -> str:
    """Whether the program would fit run in phases, with the figure to back it."""
    plan = split_auto(program, target)
    phased = tile_memory(program, target, plan.bounds)
    fullest = int(phased.total.max())
    if fullest <= target.bytes_per_tile:
        return (
            f"It would fit in phases: with phases='auto' ({len(plan.names)} phases, weights in "
            f"streaming memory) the fullest tile needs {fullest:,} bytes."
        )
    return (
        f"Even with phases='auto' ({len(plan.names)} phases) the fullest tile would need "
        f"{fullest:,} bytes: spread it over more IPUs."
    )


def io_tile_bytes(built: Built, mesh_target: Target) -> np.ndarray:
    """Bytes on each IO tile: the largest phase's streamed data, split over the IO tiles."""
    io = mesh_target.io_tiles if built.plan is not None else 0
    if not io or not built.streams:
        return np.zeros(0, np.int64)
    largest = max(s.load_bytes + s.store_bytes for s in built.streams)
    return np.full(io, -(-largest // io), np.int64)

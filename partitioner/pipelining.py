"""Pipeline parallelism as Graphcore ran it (PopTorch `BeginBlock`, PopART pipelining): the
model's blocks split into stages, one stage per IPU along a pipeline mesh axis; the batch cut
into micro-batches that flow through the stages; each stage's forward and backward on its own
IPU; gradients accumulated over the micro-batches and the weights updated once per step.

Pipelining reorders work and never changes it, so the program that runs is the whole step on
the mesh without the pipeline axis (every value is `jax.jit`'s), and the cost is that of the
step's micro-batch program (`split_stages`, then `cost.pipelined`):

- each task is a stage's (by its `jax.named_scope`, as `phases` finds blocks; unnamed work goes
  with the block of its largest operand, else where it is first read) and runs either once
  per micro-batch (forward or backward) or once per step (the update, and the collectives
  after the accumulation). Which: a task is per micro-batch when the micro-batch dimension of
  the batch arguments reaches it. That is sharding propagation with a mesh axis of its own for
  the micro-batches (`MICROBATCH`): gradients summed over the batch are pending sums over that
  axis, so the optimizer that reads them runs once per step, exactly as gradient accumulation
  makes it;
- each stage's program is its own tasks, forward, backward, then update; its memory is that
  program's by liveness, plus the activations it stashes for the micro-batches in flight.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowering import Graph, Value, op_reads
from partitioner.cost.compute import amp_flops_per_cycle
from partitioner.cost.links import CollectiveCost
from partitioner.cost.pipelined import PipelineCost, StageCost, send_cycles
from partitioner.cost.summary import StepCost, matmul_dtype
from partitioner.cost.vector import binary_cycles
from partitioner.errors import ConfigError
from partitioner.layout import tile_bytes
from partitioner.memory import PhaseBounds, TileMemory, task_excess, tile_memory
from partitioner.mesh import Mesh, make_mesh
from partitioner.phases import (
    BACKWARD,
    FORWARD,
    block_label,
    direction,
    home_blocks,
    scope_blocks,
)
from partitioner.program import Program, Superstep
from partitioner.propagation import propagate_shardings
from partitioner.sharding import Sharding
from partitioner.target import Target
from partitioner.tile_rules.matmul import shrunk_by

MICROBATCH = "microbatch"  # the pseudo mesh axis micro-batches are told apart by
UPDATE = "update"
KINDS = (FORWARD, BACKWARD, UPDATE)  # a stage's tasks run in this order


@dataclass(frozen=True)
class Pipeline:
    """How to pipeline a step over a mesh axis.

    `axis`: the mesh axis whose IPUs are the stages, one stage each.
    `stages`: "auto" (the program's `jax.named_scope` blocks, in order, cut into as many
    contiguous stages as the axis has IPUs, balancing each stage's cycles, as Graphcore's
    auto-pipeliner does), or one entry per stage: a scope name or a sequence of scope names.
    `microbatches`: how many micro-batches a step's batch is cut into (Graphcore's gradient
    accumulation count). `recompute`: each stage recomputes its forward in its backward from
    the stage's inputs, so it stashes only those per micro-batch in flight (Graphcore's
    recomputation checkpoints at stage boundaries). `batch_argnums`: the positional arguments
    whose leading dimension is the batch (default: the last one, as in `step(params,
    opt_state, batch)`). `optimizer_state_offchip`: what only the update reads (an optimizer's
    moments) stays in streaming memory and is streamed in and out for the update, as
    Graphcore's BERT ran (`optimizer_state_offchip`)."""

    axis: str
    stages: Any = "auto"
    microbatches: int = 1
    recompute: bool = False
    batch_argnums: tuple[int, ...] | None = None
    optimizer_state_offchip: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.axis, str) or not self.axis:
            raise ConfigError(f"Pipeline(axis={self.axis!r}): name a mesh axis, e.g. 'pp'")
        if isinstance(self.microbatches, bool) or not isinstance(self.microbatches, int):
            raise ConfigError(
                f"Pipeline(microbatches={self.microbatches!r}): give a positive integer"
            )
        if self.microbatches < 1:
            raise ConfigError(
                f"Pipeline(microbatches={self.microbatches}): give at least 1 micro-batch"
            )
        if self.stages != "auto":
            stage_names(self.stages)  # checks the form
        if self.batch_argnums is not None:
            object.__setattr__(self, "batch_argnums", tuple(self.batch_argnums))


def stage_names(stages: Any) -> tuple[tuple[str, ...], ...]:
    """Each stage's scope names, from `Pipeline.stages` given as a list."""
    if isinstance(stages, str) or not isinstance(stages, Sequence) or not stages:
        raise ConfigError(
            f"Pipeline(stages={stages!r}): give 'auto' or one entry per stage, each a "
            "jax.named_scope name or a list of them"
        )
    out = []
    for entry in stages:
        names = (entry,) if isinstance(entry, str) else tuple(entry)
        if not names or not all(isinstance(n, str) and n for n in names):
            raise ConfigError(
                f"Pipeline(stages=...): stage {entry!r} is not a scope name or a list of them"
            )
        out.append(names)
    return tuple(out)


# ---- which tasks run per micro-batch -----------------------------------------------------------


def per_microbatch(graph: Graph, batch_inputs: Sequence[int]) -> list[bool]:
    """For each op of `graph`, whether it runs once per micro-batch: the batch arguments'
    leading dimension, split over `MICROBATCH`, reaches its factors, or it reads a value that
    varies by micro-batch. A result summed over that axis (a weight's gradient, the mean loss)
    is a sum over micro-batches, accumulated: what reads it runs once per step."""
    given = {}
    for index in batch_inputs:
        value = graph.inputs[index]
        if value.shape:
            given[value] = Sharding(((MICROBATCH,),) + ((),) * (len(value.shape) - 1))
    propagated = propagate_shardings(graph, given, {})
    varying: set[Value] = set(given)
    out = []
    for op in graph.ops:
        axes = propagated.op_factors[op]
        reduction = propagated.factors[op].reduction
        reached = any(MICROBATCH in a for a in axes)
        summed = any(MICROBATCH in axes[f] for f in reduction)
        each = reached or any(v in varying for v in op_reads(op))
        if each and not summed:
            varying.update(op.results)
        out.append(each)
    return out


# ---- stages ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageSplit:
    """Each task's stage and kind (`FORWARD` or `BACKWARD` once per micro-batch, `UPDATE` once
    per step), and each stage's blocks."""

    blocks: tuple[tuple[str, ...], ...]
    stage_of: tuple[int, ...]
    kind_of: tuple[str, ...]

    @property
    def stages(self) -> int:
        return len(self.blocks)

    @functools.cached_property
    def _members(self) -> dict[tuple[int, str], list[int]]:
        """Each (stage, kind)'s task indices in program order, found once."""
        members: dict[tuple[int, str], list[int]] = {}
        for i, key in enumerate(zip(self.stage_of, self.kind_of, strict=True)):
            members.setdefault(key, []).append(i)
        return members

    def indices(self, stage: int, kinds: Sequence[str] = KINDS) -> list[int]:
        """The stage's task indices, forward, then backward, then update (program order
        within each)."""
        return [i for kind in kinds for i in self._members.get((stage, kind), ())]


def balanced_stages(blocks: Sequence[str], weights: Sequence[int], count: int) -> list[list[str]]:
    """`blocks` in order cut into `count` contiguous non-empty runs whose largest total weight
    is least (dynamic programming over cut points)."""
    n = len(blocks)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(count + 1)]
    cut = [[0] * (n + 1) for _ in range(count + 1)]
    best[0][0] = 0
    for k in range(1, count + 1):
        for j in range(k, n - count + k + 1):
            for i in range(k - 1, j):
                worst = max(best[k - 1][i], prefix[j] - prefix[i])
                if worst < best[k][j]:
                    best[k][j], cut[k][j] = worst, i
    runs, j = [], n
    for k in range(count, 0, -1):
        i = cut[k][j]
        runs.append(list(blocks[i:j]))
        j = i
    return runs[::-1]


def _stage_blocks(program: Program, pipeline: Pipeline, count: int, each: list[bool]) -> list:
    """Each stage's blocks: as given, or the program's blocks balanced by their per-micro-batch
    cycles."""
    if pipeline.stages != "auto":
        given = [list(names) for names in stage_names(pipeline.stages)]
        if len(given) != count:
            raise ConfigError(
                f"Pipeline(stages=...) names {len(given)} stages, but the mesh axis "
                f"{pipeline.axis!r} has {count} IPUs; give one stage per IPU"
            )
        return given
    blocks = scope_blocks(program)
    if len(blocks) < count:
        raise ConfigError(
            f"Pipeline(stages='auto') found {len(blocks)} jax.named_scope blocks "
            f"({', '.join(blocks) or 'none'}) for {count} stages on axis {pipeline.axis!r}: "
            "wrap each layer in jax.named_scope, or pipeline over fewer IPUs"
        )
    weight = dict.fromkeys(blocks, 0)
    for task, label, per_mb in zip(program.tasks, _labels(program, blocks), each, strict=True):
        if label is not None and per_mb:
            weight[label] += sum(s.cycles for s in task.supersteps)
    return balanced_stages(blocks, [weight[b] for b in blocks], count)


def _labels(program: Program, names: Sequence[str]) -> list[str | None]:
    return [block_label(task, names) for task in program.tasks]


def split_stages(program: Program, pipeline: Pipeline, count: int, each: list[bool]) -> StageSplit:
    """Each task's stage and kind. A named task is its block's stage's; an unnamed one goes
    with the block of its largest operand (its home, as phases place an optimizer's update),
    else where it is first read. Its direction is its scope's (jax names backward ops
    `transpose(...)`), or backward when it reads a backward result."""
    blocks = _stage_blocks(program, pipeline, count, each)
    stage_of_block = {b: s for s, names in enumerate(blocks) for b in names}
    names = list(stage_of_block)
    labels = _labels(program, names)
    if not any(labels):
        raise ConfigError(
            f"Pipeline(stages={pipeline.stages!r}): no op is in a jax.named_scope called any "
            f"of {names}"
        )
    homes = home_blocks(program, labels)
    made: dict[Value, int] = {}
    backward: set[Value] = set()
    stage_of: list[int] = []
    kind_of: list[str] = []
    floating: set[int] = set()
    for index, (task, label) in enumerate(zip(program.tasks, labels, strict=True)):
        home = homes.get(task.op.results[0]) if task.op.results else None
        if label is not None:
            stage = stage_of_block[label]
        elif home is not None:
            stage = stage_of_block[home]
        else:
            # No block of its own (a constant, or an optimizer's `b1 * mu` on state no block
            # reads): it runs where it is first read.
            stage = max((made[v] for v in task.inputs if v in made), default=0)
            floating.add(index)
        is_backward = direction(task.op.loc.scope) == BACKWARD or any(
            v in backward for v in task.inputs
        )
        kind = (BACKWARD if is_backward else FORWARD) if each[index] else UPDATE
        if kind == BACKWARD:
            backward.update(task.op.results)
        stage_of.append(stage)
        kind_of.append(kind)
        made.update(dict.fromkeys(task.op.results, stage))
    _float_to_readers(program, stage_of, floating)
    return StageSplit(tuple(tuple(b) for b in blocks), tuple(stage_of), tuple(kind_of))


def _float_to_readers(program: Program, stage_of: list[int], floating: set[int]) -> None:
    """Tasks with no home run on the stage of their first reader (last to first, so a chain of
    them follows the reader at its end)."""
    first_reader: dict[Value, int] = {}
    for index in range(len(program.tasks) - 1, -1, -1):
        task = program.tasks[index]
        if index in floating:
            readers = [first_reader[v] for v in task.op.results if v in first_reader]
            if readers:
                stage_of[index] = stage_of[min(readers)]
        for value in task.inputs:
            first_reader[value] = index


# ---- each stage's program ----------------------------------------------------------------------


def stage_order(program: Program, split: StageSplit, stage: int) -> list[int]:
    """The stage's task indices in the order it runs them: each micro-batch's forward and
    backward in program order, then the update, one result at a time (`_depth_first`)."""
    order = split.indices(stage, (FORWARD, BACKWARD))
    return order + _depth_first(program, split.indices(stage, (UPDATE,)))


def stage_program(program: Program, split: StageSplit, stage: int) -> Program:
    """The stage's own tasks (`stage_order`); its inputs are the arguments it reads and what
    other stages send it, its outputs the results it sends or returns."""
    tasks = tuple(program.tasks[i] for i in stage_order(program, split, stage))
    made = {v for t in tasks for v in t.op.results}
    read = {v: None for t in tasks for v in t.inputs if v not in made}
    elsewhere = {
        v for i, t in enumerate(program.tasks) if split.stage_of[i] != stage for v in t.inputs
    }
    outputs = [v for v in program.outputs if v in made]
    outputs += [v for v in made if v in elsewhere and v not in outputs]
    inputs = tuple(read)
    return Program(
        inputs=inputs,
        input_layouts=tuple(program.layouts[v] for v in inputs),
        tasks=tasks,
        outputs=tuple(outputs),
        layouts=program.layouts,
        tiles=program.tiles,
    )


def _depth_first(program: Program, indices: Sequence[int]) -> list[int]:
    """`indices` in an order that finishes each result before starting the next (each sink's
    producers, depth first, then the sink), as PopART runs each weight's update to its end
    before the next: an optimizer written leaf by leaf (all first moments, then all second
    moments, ...) then holds one weight's temporaries at a time, not every weight's."""
    chosen = set(indices)
    maker = {v: i for i in indices for v in program.tasks[i].op.results}
    read = {v for i in indices for v in program.tasks[i].inputs}
    order: list[int] = []
    done: set[int] = set()
    for sink in indices:
        if any(v in read for v in program.tasks[sink].op.results):
            continue
        stack = [(sink, False)]
        while stack:
            i, expanded = stack.pop()
            if i in done:
                continue
            if expanded:
                done.add(i)
                order.append(i)
                continue
            stack.append((i, True))
            for value in reversed(program.tasks[i].inputs):
                j = maker.get(value)
                if j is not None and j in chosen and j not in done:
                    stack.append((j, False))
    order += [i for i in indices if i not in done]  # results read by no update task's sink
    return order


def in_flight(stage: int, stages: int, microbatches: int) -> int:
    """Micro-batches whose activations a stage holds at once: its forward of micro-batch m runs
    in pipeline cycle m + stage and its backward in m + 2 (stages - 1) - stage."""
    return min(microbatches, 2 * (stages - 1 - stage) + 1)


def stashed(program: Program, split: StageSplit, stage: int, recompute: bool) -> list[Value]:
    """What the stage keeps per micro-batch from its forward to its backward: with
    recomputation, the inputs its forward receives from the previous stage; without, every
    value its backward reads that its forward made or received."""
    forward = split.indices(stage, (FORWARD,))
    backward = split.indices(stage, (BACKWARD,))
    made_forward = {v for i in forward for v in program.tasks[i].op.results}
    made_here = {v for i in split.indices(stage) for v in program.tasks[i].op.results}
    arguments = set(program.inputs)
    received = {
        v
        for i in forward
        for v in program.tasks[i].inputs
        if v not in made_here and v not in arguments
    }
    if recompute:
        return sorted(received, key=lambda v: v.id)
    read_back = {v for i in backward for v in program.tasks[i].inputs}
    return sorted(read_back & (made_forward | received), key=lambda v: v.id)


# ---- the mesh ----------------------------------------------------------------------------------


def pipeline_stages(pipeline: Pipeline, mesh: Mesh) -> int:
    """The pipeline axis's size: one stage per IPU along it."""
    if pipeline.axis not in mesh.shape:
        raise ConfigError(
            f"Pipeline(axis={pipeline.axis!r}): the mesh has axes {list(mesh.axis_names)}; "
            f"make a mesh with an axis named {pipeline.axis!r}, one IPU per stage along it"
        )
    return mesh.shape[pipeline.axis]


def without_axis(mesh: Mesh, axis: str) -> Mesh:
    """The mesh of one stage's IPUs: every axis but `axis` (one IPU when none is left)."""
    kept = [(n, s) for n, s in zip(mesh.axis_names, mesh.axis_shapes, strict=True) if n != axis]
    if not kept:
        kept = [("ipu", 1)]
    names, shapes = zip(*kept, strict=True)
    return make_mesh(shapes, names, target=mesh.target)


# ---- each stage's memory and cycles ------------------------------------------------------------


def _stage_view(
    program: Program, split: StageSplit, stage: int, pipeline: Pipeline, target: Target
) -> tuple[Program, PhaseBounds | None, np.ndarray]:
    """The stage's program as its memory sees it, its phases (with the optimizer state off
    chip, the update is a phase of its own, so what only it reads is on chip only while it
    runs, and each result streams out as it is made), and its stash per tile for the other
    micro-batches in flight."""
    own = stage_program(program, split, stage)
    per_microbatch_tasks = len(split.indices(stage, (FORWARD, BACKWARD)))
    bounds = None
    if pipeline.optimizer_state_offchip and 0 < per_microbatch_tasks < len(own.tasks):
        bounds = PhaseBounds([(0, per_microbatch_tasks), (per_microbatch_tasks, len(own.tasks))])
        updated = {v for t in own.tasks[per_microbatch_tasks:] for v in t.op.results}
        own = dataclasses.replace(own, outputs=tuple(v for v in own.outputs if v not in updated))
    stash = np.zeros(target.tiles_per_ipu, np.int64)
    extra = in_flight(stage, split.stages, pipeline.microbatches) - 1
    if extra > 0:
        for value in stashed(program, split, stage, pipeline.recompute):
            layout = program.layouts[value]
            stash[layout.start : layout.stop] += tile_bytes(layout, value.dtype)
    return own, bounds, extra * stash


def stage_memory(
    program: Program, split: StageSplit, stage: int, pipeline: Pipeline, target: Target
) -> tuple[Program, TileMemory]:
    """The stage's own program (`_stage_view`) and its tile memory by liveness over it, its
    stash for the micro-batches in flight among the not-always-live variables (the memory's
    peak tasks index that program)."""
    own, bounds, stash = _stage_view(program, split, stage, pipeline, target)
    memory = tile_memory(own, target, bounds)
    return own, dataclasses.replace(memory, not_always_live=memory.not_always_live + stash)


def fit_stages(
    program: Program, split: StageSplit, pipeline: Pipeline, target: Target, rounds: int = 4
) -> Program:
    """Stages whose tiles are over budget get the matmuls that run while they are over
    re-planned with that much less temporary memory, as Graphcore lowered
    `availableMemoryProportion` per IPU for BERT (0.15 on the embedding's IPU, 0.25 on the
    others); again while that keeps shrinking the excess."""
    producers = {v: t.op for t in program.tasks for v in t.op.results}
    worst: dict[int, int] = {}
    for _ in range(rounds):
        tasks = list(program.tasks)
        changed = False
        for s in range(split.stages):
            order = stage_order(program, split, s)
            own, bounds, extra = _stage_view(program, split, s, pipeline, target)
            excess = task_excess(own, target, bounds, extra)
            if max(excess, default=0) <= 0 or max(excess) >= worst.get(s, max(excess) + 1):
                continue
            worst[s] = max(excess)
            for i, over in zip(order, excess, strict=True):
                shrunk = shrunk_by(tasks[i], over, producers, target)
                changed |= shrunk is not tasks[i]
                tasks[i] = shrunk
        if not changed:
            break
        program = dataclasses.replace(program, tasks=tuple(tasks))
    return program


def _cycles(program: Program, indices: Sequence[int]) -> int:
    return sum(step.cycles for i in indices for step in program.tasks[i].supersteps)


def _flops(program: Program, indices: Sequence[int]) -> int:
    return sum(step.flops for i in indices for step in program.tasks[i].supersteps)


def _traffic(program: Program, split: StageSplit) -> tuple[list[int], list[int], list[int]]:
    """Per stage: bytes it sends forward per micro-batch, returns backward per micro-batch (a
    value passes every stage between its maker and its reader), and receives once per step
    (accumulated gradients another stage updates)."""
    count = split.stages
    sends, returns, late = [0] * count, [0] * count, [0] * count
    maker = {v: i for i, t in enumerate(program.tasks) for v in t.op.results}
    seen: set[tuple[Value, int]] = set()
    for i, task in enumerate(program.tasks):
        b = split.stage_of[i]
        for value in task.inputs:
            j = maker.get(value)
            if j is None or split.stage_of[j] == b or (value, b) in seen:
                continue
            seen.add((value, b))
            a = split.stage_of[j]
            if UPDATE in (split.kind_of[i], split.kind_of[j]):
                late[b] += value.nbytes
            elif a < b:
                for s in range(a, b):
                    sends[s] += value.nbytes
            else:
                for s in range(b + 1, a + 1):
                    returns[s] += value.nbytes
    return sends, returns, late


def _accumulated(
    program: Program, split: StageSplit, stage: int, read_by_update: set[Value]
) -> list[Value]:
    """Values the stage makes each micro-batch that the update reads (`read_by_update`):
    gradients summed into accumulators."""
    per_microbatch_made = {
        v for i in split.indices(stage, (FORWARD, BACKWARD)) for v in program.tasks[i].op.results
    }
    return sorted(per_microbatch_made & read_by_update, key=lambda v: v.id)


def _state(program: Program, split: StageSplit, stage: int) -> int:
    """Bytes of the arguments only the stage's update reads (an optimizer's state)."""
    arguments = set(program.inputs)
    per_microbatch = {
        v for i in split.indices(stage, (FORWARD, BACKWARD)) for v in program.tasks[i].inputs
    }
    update = {v for i in split.indices(stage, (UPDATE,)) for v in program.tasks[i].inputs}
    return sum(v.nbytes for v in (update & arguments) - per_microbatch)


def _streamed_cycles(target: Target, nbytes: int) -> int:
    """Loading and storing `nbytes` of state at once (full duplex), after one latency."""
    if nbytes <= 0:
        return 0
    rate = target.streaming_bytes_per_second / target.clock_hz
    return target.streaming_latency_cycles + math.ceil(nbytes / rate)


def stage_costs(
    program: Program,
    split: StageSplit,
    pipeline: Pipeline,
    target: Target,
    memories: Sequence[TileMemory],
) -> list[StageCost]:
    """Each stage's cycles per micro-batch (forward; backward with recomputation and gradient
    accumulation), per step (update, what it receives once, its state streamed), its sends
    and its memory."""
    sends, returns, late = _traffic(program, split)
    read_by_update = {
        v for i, t in enumerate(program.tasks) if split.kind_of[i] == UPDATE for v in t.inputs
    }
    out = []
    for s in range(split.stages):
        forward = split.indices(s, (FORWARD,))
        backward = split.indices(s, (BACKWARD,))
        update = split.indices(s, (UPDATE,))
        f = _cycles(program, forward)
        recompute = f if pipeline.recompute else 0
        accumulate = sum(
            binary_cycles("add", -(-v.size // target.tiles_per_ipu), v.dtype, target)
            for v in _accumulated(program, split, s, read_by_update)
        )
        state = _state(program, split, s) if pipeline.optimizer_state_offchip else 0
        u = _cycles(program, update) + send_cycles(target, late[s])
        forward_flops = _flops(program, forward)
        per_microbatch_flops = forward_flops + _flops(program, backward)
        per_microbatch_flops += forward_flops if pipeline.recompute else 0
        out.append(
            StageCost(
                stage=s,
                blocks=split.blocks[s],
                forward_cycles=f,
                backward_cycles=_cycles(program, backward) + recompute + accumulate,
                update_cycles=u + _streamed_cycles(target, state),
                send_bytes=sends[s],
                return_bytes=returns[s],
                recompute_cycles=recompute,
                accumulate_cycles=accumulate,
                in_flight=in_flight(s, split.stages, pipeline.microbatches),
                stash_bytes=sum(v.nbytes for v in stashed(program, split, s, pipeline.recompute)),
                peak_tile_bytes=int(memories[s].total.max()),
                flops=pipeline.microbatches * per_microbatch_flops + _flops(program, update),
                streaming_bytes=2 * state,
            )
        )
    return out


# ---- the step's cost ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Mix:
    """How the stages' per-micro-batch supersteps spend their cycles, and the tiles they use
    (cycle-weighted): what an aggregate of pipeline cycles is made of."""

    compute: float
    exchange: float
    sync: float
    link: float
    tiles: int

    @classmethod
    def of(cls, steps: Sequence[Superstep]) -> _Mix:
        total = sum(s.cycles for s in steps) or 1
        return cls(
            sum(s.compute_cycles for s in steps) / total,
            sum(s.exchange_cycles for s in steps) / total,
            sum(s.sync_cycles for s in steps) / total,
            sum(s.link_cycles for s in steps) / total,
            round(sum(s.tiles * s.cycles for s in steps) / total),
        )


def _aggregate(
    name: str, cycles: Sequence[int], sends: Sequence[int], sync: int, mix: _Mix
) -> Superstep:
    """Pipeline cycles as one record: the stages' work, split as their supersteps split it,
    then their sends (over IPU-Links) and syncs."""
    send = sum(sends)
    syncs = sync * len(cycles)
    work = sum(cycles) - send - syncs
    exchange = round(work * mix.exchange)
    step_sync = round(work * mix.sync)
    link = round(work * mix.link)
    return Superstep(
        name=name,
        op="pipeline",
        source="",
        tiles=mix.tiles,
        flops=0,
        exchange_bytes=0,
        compute_cycles=work - exchange - step_sync - link,
        exchange_cycles=exchange,
        sync_cycles=syncs + step_sync,
        sync_group="pipeline",
        link_cycles=send + link,
        kind="pipeline",
    )


def _after(name: str, cycles: int, kind: str) -> Superstep:
    group = "streaming" if kind == "stream" else "pipeline"
    return Superstep(name, "pipeline", "", 0, 0, 0, 0, 0, 0, group, cycles, kind)


def pipelined_step_cost(
    cost: PipelineCost, program: Program, split: StageSplit, target: Target
) -> StepCost:
    """The step as the report reads it: the pipeline's fill, steady state and drain, then the
    slowest stage's update; FLOPs and bytes per IPU are the stages' mean."""
    count, n = len(cost.stages), cost.microbatches
    per_microbatch = [
        step
        for i, kind in enumerate(split.kind_of)
        if kind != UPDATE
        for step in program.tasks[i].supersteps
    ]
    mix = _Mix.of(per_microbatch)
    edges = [0, count - 1, count - 1 + n, len(cost.cycles)]
    names = ("pipeline fill", "pipeline steady state", "pipeline drain")
    steps = [
        _aggregate(
            f"{name} ({b - a} cycles)",
            cost.cycles[a:b],
            cost.send_cycles[a:b],
            cost.sync_cycles,
            mix,
        )
        for name, (a, b) in zip(names, itertools.pairwise(edges), strict=True)
        if b > a
    ]
    slowest = max(cost.stages, key=lambda s: s.update_cycles)
    update = [
        step
        for i in stage_order(program, split, slowest.stage)
        if split.kind_of[i] == UPDATE
        for step in program.tasks[i].supersteps
    ]
    streamed = _streamed_cycles(target, slowest.streaming_bytes // 2)
    received = slowest.update_cycles - sum(step.cycles for step in update) - streamed
    if received > 0:
        update.append(_after("update: gradients from other stages", received, "pipeline"))
    if streamed > 0:
        update.append(_after("update: optimizer state streamed", streamed, "stream"))
    collectives: list[CollectiveCost] = []
    link = exchange = 0
    for i, task in enumerate(program.tasks):
        times = 1 if split.kind_of[i] == UPDATE else n
        for step in task.supersteps:
            exchange += times * step.exchange_bytes
            if step.collective is not None:
                collectives.append(step.collective)
                link += times * step.collective.bytes_per_ipu
    link += n * sum(s.send_bytes + s.return_bytes for s in cost.stages)
    return StepCost(
        supersteps=(*steps, *update),
        collectives=tuple(collectives),
        phases=(),
        total_cycles=cost.total_cycles,
        flops=sum(s.flops for s in cost.stages) // count,
        exchange_bytes=exchange // count,
        link_bytes=link // count,
        streaming_bytes=sum(s.streaming_bytes for s in cost.stages) // count,
        peak_flops_per_cycle=amp_flops_per_cycle(target, matmul_dtype(program)),
    )

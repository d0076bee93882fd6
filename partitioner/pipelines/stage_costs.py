"""Each stage's cycles and traffic (`stage_costs`): per micro-batch its forward and its backward
(with recomputation and gradient accumulation), per step its update (what it receives once,
its optimizer state streamed), and the bytes it sends to its neighbours."""

from __future__ import annotations

import math
from collections.abc import Sequence

from lowering import Value
from partitioner.cost.vector import binary_cycles
from partitioner.memory.tiles import TileMemory
from partitioner.phases.scopes import BACKWARD, FORWARD
from partitioner.pipelines.pipeline import Pipeline
from partitioner.pipelines.schedule import StageCost, send_cycles
from partitioner.pipelines.stage_memory import in_flight, stashed
from partitioner.pipelines.stages import UPDATE, StageSplit
from partitioner.program import Program
from partitioner.target import Target


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


def _accumulate_cycles(
    program: Program, split: StageSplit, stage: int, read_by_update: set[Value], target: Target
) -> int:
    """Adding one micro-batch's gradients into their accumulators, spread over the tiles."""
    return sum(
        binary_cycles("add", -(-v.size // target.tiles_per_ipu), v.dtype, target)
        for v in _accumulated(program, split, stage, read_by_update)
    )


def _state(program: Program, split: StageSplit, stage: int) -> int:
    """Bytes of the arguments only the stage's update reads (an optimizer's state)."""
    arguments = set(program.inputs)
    per_microbatch = {
        v for i in split.indices(stage, (FORWARD, BACKWARD)) for v in program.tasks[i].inputs
    }
    update = {v for i in split.indices(stage, (UPDATE,)) for v in program.tasks[i].inputs}
    return sum(v.nbytes for v in (update & arguments) - per_microbatch)


def streamed_cycles(target: Target, nbytes: int) -> int:
    """Loading and storing `nbytes` of state at once (full duplex), after one latency.

    Not `phases.streaming.streaming_cycles` plus the latency, though it is the same rate: this
    divides by the bytes per cycle where that multiplies by the clock, and the two round to
    different cycles for some sizes, so sharing one formula would move the figures."""
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
        accumulate = _accumulate_cycles(program, split, s, read_by_update, target)
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
                update_cycles=u + streamed_cycles(target, state),
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

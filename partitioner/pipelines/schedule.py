"""A pipelined step's cost, as Graphcore's pipelines run (docs/target.md, "Pipelining").

S stages on S IPUs, each running its stage's forward and backward (PopTorch: "for each stage,
forward and backward passes are always executed on the same IPU"), N micro-batches. In pipeline
cycle t, stage s runs the forward of micro-batch t - s and the backward of micro-batch
t - 2 (S - 1) + s, when those exist: the last stage runs a micro-batch's forward and backward in
the same cycle, and a step takes N + 2 (S - 1) cycles, PopART's `2 (P - 1) + (G - (P - 1))`
with P = 2 S - 1 forward and backward stages and G = N. A cycle lasts as long as its slowest
stage's work, then every stage sends what it made to its neighbours, at once, once all have
finished (Graphcore's auto-pipeliner: the cost of a cycle is the largest compute plus the
largest transfer), then the stages sync. After the last cycle each stage updates its weights
(the optimizer, the gradients' collectives over the replicas), all at once.

With the same work F + B on every stage and nothing to send, the step lasts
(S - 1) F + N (F + B) + (S - 1) B = (N + S - 1)(F + B), and the bubble, the share of the
stages' time spent idle, is (S - 1) / (N + S - 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from partitioner.target import Target


@dataclass(frozen=True, slots=True)
class StageCost:
    """One pipeline stage on its IPU: cycles per micro-batch and per step, the bytes it sends
    per micro-batch, and its memory."""

    stage: int
    blocks: tuple[str, ...]
    forward_cycles: int  # one micro-batch's forward
    backward_cycles: int  # one micro-batch's backward: recomputation and accumulation included
    update_cycles: int  # once per step: the optimizer and the gradients' collectives
    send_bytes: int = 0  # per micro-batch, activations to the next stage
    return_bytes: int = 0  # per micro-batch, gradients to the previous stage
    recompute_cycles: int = 0  # of the backward, the forward run again
    accumulate_cycles: int = 0  # of the backward, adding the gradients into accumulators
    in_flight: int = 1  # micro-batches whose activations it holds at once
    stash_bytes: int = 0  # per micro-batch in flight, on the whole IPU
    peak_tile_bytes: int = 0
    flops: int = 0  # per step
    streaming_bytes: int = 0  # per step: its optimizer state, streamed in and out


@dataclass(frozen=True, slots=True)
class PipelineCost:
    """A pipelined step: its stages, the duration of every pipeline cycle (compute, sends and
    sync) and of the update after them."""

    microbatches: int
    stages: tuple[StageCost, ...]
    cycles: tuple[int, ...]  # each pipeline cycle's duration
    send_cycles: tuple[int, ...]  # of which, the sends after the slowest stage finished
    sync_cycles: int  # per pipeline cycle
    update_cycles: int  # the slowest stage's update
    axis: str = ""  # the mesh axis the stages lie along

    @property
    def pipeline_cycles(self) -> int:
        return sum(self.cycles)

    @property
    def total_cycles(self) -> int:
        return self.pipeline_cycles + self.update_cycles

    @property
    def busy_cycles(self) -> int:
        return busy_cycles(self.stages, self.microbatches)

    @property
    def bubble_fraction(self) -> float:
        return bubble_fraction(self.stages, self.microbatches, self.pipeline_cycles)


def busy_cycles(stages: Sequence[StageCost], microbatches: int) -> int:
    """Every stage's forward and backward work over the step, summed over stages."""
    return sum(microbatches * (s.forward_cycles + s.backward_cycles) for s in stages)


def bubble_fraction(stages: Sequence[StageCost], microbatches: int, pipeline_cycles: int) -> float:
    """The share of the stages' pipeline time they spend idle (waiting to fill, drain, or for a
    slower stage or a send)."""
    span = len(stages) * pipeline_cycles
    return 1.0 - busy_cycles(stages, microbatches) / span if span else 0.0


def slots(stage: int, stages: int, microbatches: int, cycle: int) -> tuple[int | None, int | None]:
    """(forward, backward) micro-batch a stage runs in a pipeline cycle, None for neither."""
    forward = cycle - stage
    backward = cycle - 2 * (stages - 1) + stage
    return (
        forward if 0 <= forward < microbatches else None,
        backward if 0 <= backward < microbatches else None,
    )


def cycle_count(stages: int, microbatches: int) -> int:
    return microbatches + 2 * (stages - 1)


def send_cycles(target: Target, nbytes: int) -> int:
    """One stage's send to a neighbour: idle cycles, then the bytes at the pipeline rate."""
    if nbytes <= 0:
        return 0
    rate = target.pipeline_send_bytes_per_second / target.clock_hz
    return target.pipeline_send_latency_cycles + math.ceil(nbytes / rate)


def schedule_pipeline(
    stages: Sequence[StageCost],
    microbatches: int,
    target: Target,
    sync_cycles: int,
    axis: str = "",
) -> PipelineCost:
    """Every pipeline cycle's duration: the slowest stage's work, the slowest send, a sync."""
    count = len(stages)
    cycles, sends = [], []
    for t in range(cycle_count(count, microbatches)):
        work, send = 0, 0
        for s in stages:
            forward, backward = slots(s.stage, count, microbatches, t)
            busy = (s.forward_cycles if forward is not None else 0) + (
                s.backward_cycles if backward is not None else 0
            )
            out = (s.send_bytes if forward is not None and s.stage < count - 1 else 0) + (
                s.return_bytes if backward is not None and s.stage > 0 else 0
            )
            work, send = max(work, busy), max(send, send_cycles(target, out))
        sends.append(send)
        cycles.append(work + send + sync_cycles)
    update = max((s.update_cycles for s in stages), default=0)
    return PipelineCost(
        microbatches, tuple(stages), tuple(cycles), tuple(sends), sync_cycles, update, axis
    )

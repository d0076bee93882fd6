"""The pipeline a user asks for (`Pipeline`, checked as it is made), and the mesh it lies on.

Pipeline parallelism as Graphcore ran it (PopTorch `BeginBlock`, PopART pipelining): the model's
blocks split into stages, one stage per IPU along a pipeline mesh axis; the batch cut into
micro-batches that flow through the stages; each stage's forward and backward on its own IPU;
gradients accumulated over the micro-batches and the weights updated once per step. Pipelining
reorders work and never changes it, so the program that runs is the whole step on the mesh
without the pipeline axis (`without_axis`; every value is `jax.jit`'s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from partitioner.errors import ConfigError
from partitioner.mesh import Mesh, make_mesh


@dataclass(frozen=True)
class Pipeline:
    """How to pipeline a step over a mesh axis.

    `axis`: the mesh axis whose IPUs are the stages, one stage each.
    `stages`: "auto" (the program's `jax.named_scope` blocks, in order, cut into as many
    contiguous stages as the axis has IPUs, balancing each stage's cycles, as Graphcore's
    auto-pipeliner does), or one entry per stage: a scope name or a sequence of scope names.
    `microbatches`: how many micro-batches a step's batch is cut into (Graphcore's gradient
    accumulation count). `recompute`: each stage recomputes its forward in its backward, block
    by block (each `jax.named_scope` a layer), so it stashes per micro-batch in flight only its
    inputs and each block's output that another of its blocks reads (Graphcore's BERT, a
    recomputation checkpoint on every layer's output; `recompute.py`). `batch_argnums`: the
    positional arguments whose leading dimension is the batch (default: the last one, as in
    `step(params, opt_state, batch)`; a `BatchArgumentWarning` when another argument leads
    with the batch's rows too, as `x` in `step(w, x, y)`). `optimizer_state_offchip`: what
    only the update reads (an optimizer's moments) stays in streaming memory and is streamed
    in and out for the update, as Graphcore's BERT ran (`optimizer_state_offchip`)."""

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

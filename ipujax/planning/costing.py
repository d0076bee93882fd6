"""Costing a candidate, cost-only, as `ipujax.jit(...).lower(...).compile().cost_report()` costs
it: the model made once per mesh and depth, `ipujax.jit`'s keywords for the candidate, its
inputs' bytes per IPU for the bounds, and its `Plan`.

Repeated layers are priced once: a model with a `depth` is costed at `PROXY_LAYERS` layers and
each figure extrapolated linearly to the full depth, since identical layers cost alike (GPT-3
175B: 0.0938 s at 2 layers, 0.1657 s at 4, 3.47 s extrapolated to 96 against 3.46 s compiled
whole). Pipelined plans, whose stages balance over the whole depth, are always costed whole,
but their memory bounds too come from the shallow copies: the model is made whole only for a
plan that is costed (GPT-3 175B on a Pod256: 36 pipelined meshes, each 0.4 s to make whole,
all ruled out by the bound).

The variants of one mesh and depth (phases, recomputation) share one trace (`traces`); a
pipelined candidate's `peak_floor` is read from its staged program, which its build reuses
inside the search's `partitioner.reusing` block.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ipujax.api import jit
from ipujax.errors import IpujaxError
from ipujax.planning.bounds import InputBytes, input_bytes
from ipujax.planning.candidates import PIPELINE_AXIS, Candidate
from ipujax.planning.models import Made, Model, samples_per_step
from ipujax.planning.ranking import Plan
from ipujax.planning.traces import Traces, pipelined_build
from partitioner import Mesh, PeakFloor, Pipeline, Target, make_mesh, pipeline_peak_floor

PROXY_LAYERS = (2, 4)  # depths a layered workload is costed at, then extrapolated
# How a rule (or its specs, as jax's) refuses a mesh it cannot shard: the candidate is skipped.
SKIP_ERRORS = (ValueError, NotImplementedError, IpujaxError)


@dataclass(frozen=True)
class Refused:
    """Why a candidate cannot be built or costed: the first line of the error that refused it."""

    detail: str

    @classmethod
    def by(cls, error: BaseException) -> Refused:
        text = str(error).strip().splitlines()
        return cls(f"{type(error).__name__}: {text[0] if text else ''}")


@dataclass
class Costing:
    """Builds and costs the candidates of one model on one target, counting the compiles."""

    model: Model
    target: Target
    compiles: int = 0
    made: dict[tuple[Any, int | None], tuple[Mesh, Made]] = field(default_factory=dict)
    traces: Traces | None = field(default_factory=Traces)  # None: each compile traces afresh

    def make(self, candidate: Candidate, layers: int | None) -> tuple[Mesh, Made]:
        """The candidate's mesh and the model made for it, once per depth: its bounds, its
        variants (phases, micro-batches, recomputation) and its costing all start from it."""
        key = (candidate.axes, layers)
        if key not in self.made:
            names, sizes = zip(*candidate.axes, strict=True)
            mesh = make_mesh(sizes, names, target=self.target)
            self.made[key] = mesh, self.model.make(mesh, layers)
        return self.made[key]

    def built(self, candidate: Candidate, layers: int | None) -> Made:
        """`(fun, args, jit_kwargs)` of the candidate, at `layers` depth (None: full)."""
        mesh, (fun, args, kwargs) = self.make(candidate, layers)
        kwargs = {**kwargs, "mesh": mesh}
        if candidate.phases:
            kwargs["phases"] = candidate.phases
        pipeline = self._pipeline(candidate, kwargs.get("pipeline"))
        if pipeline is not None:
            kwargs["pipeline"] = pipeline
        return fun, args, kwargs

    def _pipeline(self, candidate: Candidate, pipeline: Pipeline | None) -> Pipeline | None:
        """The workload's pipeline (one of the candidate's own when it has none), recomputing
        as the candidate says."""
        if candidate.pipelined and pipeline is None:
            pipeline = Pipeline(
                PIPELINE_AXIS,
                "auto",
                candidate.microbatches or 1,
                batch_argnums=self.model.batch_argnums,
            )
        if pipeline is not None and candidate.recompute is not None:
            pipeline = dataclasses.replace(pipeline, recompute=candidate.recompute)
        return pipeline

    def depths(self, candidate: Candidate) -> tuple[int | None, ...]:
        """The depths the candidate is costed at (None: full)."""
        return (None,) if candidate.pipelined else self.bound_depths()

    def bound_depths(self) -> tuple[int | None, ...]:
        """The depths a candidate's inputs are read at for its bounds (None: full)."""
        depth = self.model.depth
        return (None,) if depth is None or depth <= PROXY_LAYERS[-1] else PROXY_LAYERS

    def samples(self, args: tuple, kwargs: dict[str, Any]) -> int:
        return samples_per_step(args, kwargs, self.model.batch_argnums)

    def inputs(self, candidate: Candidate) -> InputBytes | Refused:
        """The candidate's inputs at full depth (extrapolated from the shallow copies when
        the model is layered, nothing traced), or why the mesh cannot be expressed."""
        depths = self.bound_depths()
        known = self._inputs(candidate, depths)
        if isinstance(known, Refused) and candidate.pipelined and depths != (None,):
            # A workload may refuse a pipeline fewer layers deep than its stages: whole, the
            # mesh may be expressible.
            return self._inputs(candidate, (None,))
        return known

    def _inputs(self, candidate: Candidate, depths: tuple[int | None, ...]) -> InputBytes | Refused:
        per_depth = []
        for layers in depths:
            try:
                _, args, kwargs = self.built(candidate, layers)
                per_depth.append(input_bytes(args, kwargs, kwargs["mesh"]))
            except SKIP_ERRORS as error:  # the rule's refusal, or its specs' (as jax's)
                return Refused.by(error)
        pipeline = kwargs.get("pipeline")
        total, largest = _full_depth_inputs(per_depth, self.model.depth or 0)
        offchip = bool(pipeline and pipeline.optimizer_state_offchip)
        return InputBytes(total, largest, offchip, self.samples(args, kwargs))

    def cost(self, candidate: Candidate, whole: bool = False) -> Plan | Refused:
        """The candidate costed (extrapolated from shallow copies unless `whole`), or why it
        could not be."""
        reports = []
        for layers in (None,) if whole else self.depths(candidate):
            try:
                fun, args, kwargs = self.built(candidate, layers)
                self.compiles += 1
                lowered = self._lower(fun, args, kwargs)
                reports.append(lowered.compile(check_memory_fits=False).cost_report())
            except SKIP_ERRORS as error:
                return Refused.by(error)
        full = functools.partial(self.built, candidate, None)
        samples = self.samples(args, kwargs)
        return _plan(candidate, reports, self.model.depth, samples, full, kwargs.get("pipeline"))

    def peak_floor(self, candidate: Candidate) -> PeakFloor | Refused:
        """A floor under a pipelined candidate's fullest tile, read from its program scheduled
        and split into stages before the stages' memory is swept (in the search's
        `partitioner.reusing` block, its build reuses that program), or why it could not be
        built: the same words its compile would give, from the same passes."""
        try:
            fun, args, kwargs = self.built(candidate, None)
            return pipeline_peak_floor(*pipelined_build(self._lower(fun, args, kwargs)))
        except SKIP_ERRORS as error:
            return Refused.by(error)

    def _lower(self, fun: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        if self.traces is None:
            return jit(fun, **kwargs).lower(*args)
        return self.traces.lower(fun, args, kwargs)


def _line(at_l1: float, at_l2: float, l1: int, l2: int, depth: int) -> float:
    return at_l1 + (depth - l1) * (at_l2 - at_l1) / (l2 - l1)


def _full_depth_inputs(per_depth: list[list[float]], depth: int) -> tuple[float, float]:
    """The inputs' total and largest bytes per IPU at full depth, from each depth's inputs."""
    totals = [sum(d) for d in per_depth]
    largests = [max(d, default=0.0) for d in per_depth]
    if len(per_depth) == 1:
        return totals[0], largests[0]
    # Each layer adds alike: a line through the two depths.
    total = _line(totals[0], totals[1], *PROXY_LAYERS, depth)
    # Layers as leaves of their own leave the largest leaf alone; layers stacked in one leaf
    # (for a scan) grow it with the depth.
    stacked = len(per_depth[0]) == len(per_depth[1])
    grown = _line(largests[0], largests[1], *PROXY_LAYERS, depth)
    return total, grown if stacked else max(largests)


def _plan(
    candidate: Candidate,
    reports: list[Any],
    depth: int | None,
    samples: int,
    build: Callable[[], Made],
    pipeline: Pipeline | None = None,
) -> Plan:
    """A plan from its cost report, or from two shallow copies' reports extrapolated: every
    time linearly in the layers; the peak tile linearly without phases (each layer's weights
    stay), and as the deeper copy's with phases (a phase holds one layer, so the peak grows
    little: this errs low, and `confirm` compiles the best plans whole)."""
    last = reports[-1]
    split = [r.time_split() for r in reports]
    seconds = [r.seconds for r in reports]
    if len(reports) == 1:
        total, parts, peak = seconds[0], split[0], last.peak_tile_bytes
    else:
        assert depth is not None
        l1, l2 = PROXY_LAYERS
        total = _line(seconds[0], seconds[1], l1, l2, depth)
        parts = {k: _line(split[0][k], split[1][k], l1, l2, depth) for k in split[0]}
        peaks = [r.peak_tile_bytes for r in reports]
        peak = peaks[1] if candidate.phases else round(_line(peaks[0], peaks[1], l1, l2, depth))
    return Plan(
        candidate=candidate,
        predicted_seconds=total,
        samples=samples,
        fits=peak <= last.bytes_per_tile,
        peak_tile_bytes=int(peak),
        bytes_per_tile=last.bytes_per_tile,
        collective_share=parts["collectives"] / total if total else 0.0,
        streaming_share=parts["streaming"] / total if total else 0.0,
        extrapolated=len(reports) > 1,
        build=build,
        pipeline=pipeline,
    )

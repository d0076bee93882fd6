"""The plan search: the fastest way to run one training step on a system of IPUs that fits
(docs/plan.md).

A plan is a mesh over every IPU of the system, with axes named as the model's sharding rule
knows them (`dp` replicas; `tp` for 1D tensor parallelism, `tp1` x `tp2` for 2D; `pp` pipeline
stages), and the options that go with it: phased execution, a pipeline's micro-batches and
recomputation. Each plan is costed by the cost model, cost-only, as `ipujax.jit(...).lower(...)
.compile().cost_report()` costs it, and the plans are ranked: those that fit first, then by
samples per second (a workload may give each mesh its own global batch, as Graphcore's configs
do: samples per replica times replicas).

The search does not cost every plan. In order:
- **Not expressible.** The rule (or workload) raises `ValueError` or an ipujax error for a mesh
  it cannot shard (heads that do not divide, an axis it does not know): skipped, with its words.
- **Memory lower bounds, before anything is traced.** A plan without phases keeps every input
  (weights, optimizer state) on chip: when their bytes per IPU exceed the IPU's memory, it cannot
  fit. A phased plan holds each input on chip at least while its phase runs, and all of them in
  streaming memory: the largest input's bytes per IPU must fit the chip, and the sum the
  streaming memory.
- **Dominance.** Phases only add streaming and recomputation only adds compute, so a phased plan
  is costed only for a mesh whose plain plan does not fit, and a pipeline that recomputes only
  when the one that stashes does not fit.
- **A cost lower bound.** A phased plan streams every input byte of an IPU in at least once a
  step: its samples per second are at most samples / (bytes per IPU / streaming bandwidth).
  Phased plans are costed best bound first; one whose bound is below the best plan that fits so
  far is pruned.
- **Repeated layers priced once.** A workload whose factory takes a `layers` keyword with an
  integer default (the model's depth) is costed at 2 and 4 layers and each figure extrapolated
  linearly to the full depth: identical layers cost alike (GPT-3 175B: 0.0938 s at 2 layers,
  0.1657 s at 4, 3.47 s extrapolated to 96 against 3.46 s compiled whole). The best plans are
  then compiled whole (`confirm`), and their figures replace the estimates. Pipelined plans,
  whose stages balance over the whole depth, are always costed whole.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec

from ipujax.api import jit
from ipujax.errors import ConfigError, IpujaxError
from ipujax.specs import input_specs
from partitioner import (
    IPUS_PER_MACHINE,
    IPUS_PER_POD64,
    Mesh,
    Pipeline,
    Target,
    from_spec,
    make_mesh,
)

# A system by name: its IPUs (docs/target.md, "Systems"); the chip is `target`'s (Bow default).
SYSTEM_IPUS = {
    "ipu": 1,
    "bow": IPUS_PER_MACHINE,  # a Bow-2000
    "bow2000": IPUS_PER_MACHINE,
    "m2000": IPUS_PER_MACHINE,
    "pod4": IPUS_PER_MACHINE,
    "pod16": 4 * IPUS_PER_MACHINE,
    "pod64": IPUS_PER_POD64,
    "pod128": 2 * IPUS_PER_POD64,
    "pod256": 4 * IPUS_PER_POD64,
}
# The axis names of the meshes a plan builds, the convention the examples' sharding rules read
# (replicas, Megatron 1D, PopXL 2D, pipeline stages). Only plans name axes: the partitioner finds
# the replica axes from the shardings, never by name.
MESH_AXES: tuple[str, str, str, str, str] = ("dp", "tp", "tp1", "tp2", "pp")
REPLICAS, TENSOR, TENSOR_ROWS, TENSOR_COLUMNS, PIPELINE_AXIS = MESH_AXES
# The mesh layouts tried, axes outermost first: replicas outermost, as Graphcore laid them, so
# tensor-parallel groups are neighbouring IPUs.
LAYOUTS: tuple[tuple[str, ...], ...] = (
    (REPLICAS,),
    (REPLICAS, TENSOR),
    (REPLICAS, TENSOR_ROWS, TENSOR_COLUMNS),
    (REPLICAS, PIPELINE_AXIS),
    (REPLICAS, PIPELINE_AXIS, TENSOR),
)
PROXY_LAYERS = (2, 4)  # depths a layered workload is costed at, then extrapolated
MICRO_BATCH_SIZES = (1, 2, 4, 8, 16, 32)  # pipelined, per replica: what a plan may cut into
SKIP_ERRORS = (ValueError, NotImplementedError, IpujaxError)

Maker = Callable[[Mesh, "int | None"], tuple[Callable[..., Any], tuple, dict[str, Any]]]


# ---- records ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One way to run the step: mesh axes (name, size), phases, and for a pipeline its
    micro-batches (None: the workload's own) and recomputation (None: the workload's own)."""

    axes: tuple[tuple[str, int], ...]
    phases: str | None = None
    microbatches: int | None = None
    recompute: bool | None = None

    @property
    def mesh(self) -> dict[str, int]:
        return dict(self.axes)

    @property
    def pipelined(self) -> bool:
        return PIPELINE_AXIS in self.mesh

    def describe(self) -> str:
        text = ", ".join(f"{n}={s}" for n, s in self.axes)
        if self.phases:
            text += f", phases={self.phases}"
        if self.microbatches is not None:
            text += f", {self.microbatches} micro-batches"
        if self.recompute is not None:
            text += ", recompute" if self.recompute else ", no recompute"
        return text


@dataclass(frozen=True)
class Plan:
    """A costed plan. `jit_kwargs` are `ipujax.jit`'s keywords for it (mesh, in_shardings and
    the options); `extrapolated` says its figures come from shallower copies of the model."""

    candidate: Candidate
    predicted_seconds: float
    samples: int
    fits: bool
    peak_tile_bytes: int
    bytes_per_tile: int
    collective_share: float
    streaming_share: float
    extrapolated: bool
    pipeline: Pipeline | None = None
    # Built when asked for: a layered workload's plan is costed shallow, applied whole.
    build: Callable[[], tuple[Callable[..., Any], tuple, dict[str, Any]]] | None = field(
        default=None, repr=False, compare=False
    )

    @property
    def jit_kwargs(self) -> dict[str, Any]:
        """`ipujax.jit`'s keywords for this plan: mesh, in_shardings, phases, pipeline."""
        return self.build()[2] if self.build is not None else {}

    @property
    def args(self) -> tuple:
        """The arguments of the step this plan was costed for (a workload's batch may differ
        from mesh to mesh)."""
        return self.build()[1] if self.build is not None else ()

    @property
    def mesh(self) -> dict[str, int]:
        return self.candidate.mesh

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.predicted_seconds if self.predicted_seconds > 0 else 0.0

    def jit(self, fun: Callable[..., Any], **kwargs: Any) -> Any:
        """`ipujax.jit(fun)` with this plan's mesh, shardings and options (and `kwargs`)."""
        return jit(fun, **{**self.jit_kwargs, **kwargs})

    def to_dict(self) -> dict[str, Any]:
        c = self.candidate
        return {
            "mesh": self.mesh,
            "phases": c.phases,
            "pipeline": _pipeline_dict(self.pipeline),
            "predicted_seconds": self.predicted_seconds,
            "samples_per_step": self.samples,
            "samples_per_second": self.samples_per_second,
            "fits": self.fits,
            "peak_tile_bytes": self.peak_tile_bytes,
            "bytes_per_tile": self.bytes_per_tile,
            "collective_share": self.collective_share,
            "streaming_share": self.streaming_share,
            "extrapolated": self.extrapolated,
        }


@dataclass(frozen=True)
class Skipped:
    candidate: Candidate
    reason: str  # "not expressible", "memory bound", "dominated" or "cost bound"
    detail: str


@dataclass(frozen=True)
class Plans:
    """The ranked plans (fitting first, then by samples per second) and what was not costed."""

    system: str
    ipus: int
    target: str
    plans: tuple[Plan, ...]
    skipped: tuple[Skipped, ...]
    compiles: int  # cost-only compiles the search ran (shallow copies included)

    @property
    def best(self) -> Plan:
        if not self.plans:
            raise ConfigError(
                f"no plan for a {self.system} could be costed: "
                + "; ".join(f"{s.candidate.describe()}: {s.detail}" for s in self.skipped[:4])
            )
        return self.plans[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "ipus": self.ipus,
            "target": self.target,
            "compiles": self.compiles,
            "plans": [dict(rank=i + 1, **p.to_dict()) for i, p in enumerate(self.plans)],
            "skipped": [
                {
                    "mesh": s.candidate.mesh,
                    "phases": s.candidate.phases,
                    "microbatches": s.candidate.microbatches,
                    "recompute": s.candidate.recompute,
                    "reason": s.reason,
                    "detail": s.detail,
                }
                for s in self.skipped
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)


def _pipeline_dict(pipeline: Pipeline | None) -> dict[str, Any] | None:
    if pipeline is None:
        return None
    return {
        "axis": pipeline.axis,
        "microbatches": pipeline.microbatches,
        "recompute": pipeline.recompute,
        "optimizer_state_offchip": pipeline.optimizer_state_offchip,
    }


# ---- systems and meshes ------------------------------------------------------------------------


def system_ipus(name: str) -> int:
    """The IPUs of a system named `pod16`, `pod256`, `bow` (a Bow-2000), ... or a count."""
    key = name.strip().lower().replace("-", "").replace("_", "")
    if key.isdigit() and int(key) >= 1:
        return int(key)
    if key not in SYSTEM_IPUS:
        raise ConfigError(
            f"unknown system {name!r}; choose one of {', '.join(SYSTEM_IPUS)} or a number of IPUs"
        )
    return SYSTEM_IPUS[key]


def _factorisations(n: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every way to write n as an ordered product of `parts` positive factors."""
    if parts == 1:
        yield (n,)
        return
    for first in range(1, n + 1):
        if n % first == 0:
            for rest in _factorisations(n // first, parts - 1):
                yield (first, *rest)


def meshes(
    ipus: int, layouts: Sequence[tuple[str, ...]] = LAYOUTS
) -> list[tuple[tuple[str, int], ...]]:
    """Every mesh over all `ipus` IPUs in `layouts`: each axis but dp of size 2 or more (a
    size-1 axis is the layout without it), dp dropped at size 1 unless it is the only axis."""
    found: list[tuple[tuple[str, int], ...]] = []
    for names in layouts:
        for sizes in _factorisations(ipus, len(names)):
            if any(s < 2 for s in sizes[1:]):
                continue
            axes = tuple(
                (n, s) for n, s in zip(names, sizes, strict=True) if s > 1 or n != REPLICAS
            )
            axes = axes or ((REPLICAS, 1),)
            if axes not in found:
                found.append(axes)
    return found


# ---- bounds --------------------------------------------------------------------------------------


def input_bytes(args: tuple, jit_kwargs: dict[str, Any], mesh: Mesh) -> list[float]:
    """Each input's bytes on one IPU, its block under its spec as the partitioner reads it
    (a pipeline's inputs split over its stages, on average)."""
    specs = input_specs(jit_kwargs.get("in_shardings"), args, {})
    pipeline = jit_kwargs.get("pipeline")
    stages = mesh.shape.get(pipeline.axis, 1) if pipeline else 1
    out: list[float] = []
    for i, (leaf, spec) in enumerate(zip(jax.tree.leaves(args), specs, strict=True)):
        shape = tuple(np.shape(leaf))
        block = from_spec(spec, shape, mesh.shape, f"input {i}").local_shape(shape, mesh.shape)
        dtype = getattr(leaf, "dtype", None) or np.asarray(leaf).dtype  # a Python scalar too
        out.append(math.prod(block) * np.dtype(dtype).itemsize / stages)
    return out


@dataclass(frozen=True)
class InputBytes:
    """A candidate's inputs on one IPU: their total, the largest one, whether the optimizer
    state stays off chip, and the samples of a step."""

    total: float
    largest: float
    offchip: bool = False
    samples: int = 1


def memory_bound(candidate: Candidate, inputs: InputBytes, target: Target) -> str | None:
    """Why the plan cannot fit, from its inputs' bytes per IPU alone; None if it may."""
    chip = target.bytes_per_ipu
    if candidate.phases:
        if inputs.largest > chip:
            return (
                f"its largest input is {inputs.largest / 1e6:,.0f} MB per IPU, over the chip's "
                f"{chip / 1e6:,.0f} MB"
            )
        if inputs.total > target.streaming_bytes_per_ipu:
            return (
                f"its inputs are {inputs.total / 1e9:,.1f} GB per IPU, over the streaming "
                f"memory's {target.streaming_bytes_per_ipu / 1e9:,.0f} GB"
            )
        return None
    if not inputs.offchip and inputs.total > chip:
        return (
            f"its inputs are {inputs.total / 1e6:,.0f} MB per IPU, over the chip's "
            f"{chip / 1e6:,.0f} MB"
        )
    return None


def streaming_bound_seconds(inputs: InputBytes, target: Target) -> float:
    """A phased step reads every input byte of an IPU from streaming memory at least once."""
    return inputs.total / target.streaming_bytes_per_second


# ---- the model a search costs ------------------------------------------------------------------


@dataclass(frozen=True)
class Model:
    """What the search costs: `make(mesh, layers)` returns `(fun, args, jit_kwargs)` for a mesh,
    at `layers` depth (None: the full depth). `depth` is the full depth when the model can be
    built shallower, else None. `batch_argnums` are the arguments that carry the batch.
    `choose_microbatches`: a pipelined mesh tries several micro-batch counts (a fixed global
    batch); else the workload's pipeline keeps its own."""

    make: Maker
    depth: int | None = None
    batch_argnums: tuple[int, ...] | None = None
    choose_microbatches: bool = False


def samples_per_step(
    args: tuple, jit_kwargs: dict[str, Any], batch_argnums: Sequence[int] | None = None
) -> int:
    """The samples a step trains on: the leading dimension of the first leaf of the batch
    argument (`batch_argnums`, else the pipeline's, else the last positional argument)."""
    pipeline = jit_kwargs.get("pipeline")
    positions = batch_argnums or (pipeline and pipeline.batch_argnums) or (-1,)
    leaves = jax.tree.leaves(args[positions[0]]) if args else []
    shape = np.shape(leaves[0]) if leaves else ()
    return int(shape[0]) if shape else 1


# ---- the search ---------------------------------------------------------------------------------


@dataclass
class _Search:
    model: Model
    target: Target
    compiles: int = 0
    made: dict[tuple[Any, int | None], Any] = field(default_factory=dict)
    plans: list[Plan] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    progress: Callable[[str], None] | None = None

    def note(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)

    def skip(self, candidate: Candidate, reason: str, detail: str) -> None:
        self.skipped.append(Skipped(candidate, reason, detail))

    def mesh(self, candidate: Candidate) -> Mesh:
        names, sizes = zip(*candidate.axes, strict=True)
        return make_mesh(sizes, names, target=self.target)

    def depths(self, candidate: Candidate) -> tuple[int | None, ...]:
        depth = self.model.depth
        if depth is None or candidate.pipelined or depth <= PROXY_LAYERS[-1]:
            return (None,)
        return PROXY_LAYERS

    def built(self, candidate: Candidate, layers: int | None) -> tuple[Callable, tuple, dict]:
        """`(fun, args, jit_kwargs)` of the candidate, at `layers` depth (None: full)."""
        mesh, (fun, args, kwargs) = self.make(candidate, layers)
        kwargs = {**kwargs, "mesh": mesh}
        if candidate.phases:
            kwargs["phases"] = candidate.phases
        pipeline = kwargs.get("pipeline")
        if candidate.pipelined and pipeline is None:
            pipeline = Pipeline(
                PIPELINE_AXIS,
                "auto",
                candidate.microbatches or 1,
                batch_argnums=self.model.batch_argnums,
            )
        if pipeline is not None and candidate.recompute is not None:
            pipeline = dataclasses.replace(pipeline, recompute=candidate.recompute)
        if pipeline is not None:
            kwargs["pipeline"] = pipeline
        return fun, args, kwargs

    def make(
        self, candidate: Candidate, layers: int | None
    ) -> tuple[Mesh, tuple[Callable, tuple, dict]]:
        """The candidate's mesh and the model made for it, once per depth: its bounds, its
        variants (phases, micro-batches, recomputation) and its costing all start from it."""
        key = (candidate.axes, layers)
        if key not in self.made:
            mesh = self.mesh(candidate)
            self.made[key] = mesh, self.model.make(mesh, layers)
        made: tuple[Mesh, tuple[Callable, tuple, dict]] = self.made[key]
        return made

    def samples(self, args: tuple, kwargs: dict[str, Any]) -> int:
        return samples_per_step(args, kwargs, self.model.batch_argnums)

    def inputs(self, candidate: Candidate) -> InputBytes | str:
        """The candidate's inputs at full depth (extrapolated from the shallow copies when
        the model is layered, nothing traced), or why the mesh cannot be expressed."""
        per_depth = []
        for layers in self.depths(candidate):
            try:
                _, args, kwargs = self.built(candidate, layers)
                per_depth.append(input_bytes(args, kwargs, kwargs["mesh"]))
            except SKIP_ERRORS as error:  # the rule's refusal, or its specs' (as jax's)
                return _first_line(error)
        pipeline = kwargs.get("pipeline")
        totals = [sum(d) for d in per_depth]
        largests = [max(d, default=0.0) for d in per_depth]
        total, largest = totals[0], largests[0]
        if len(per_depth) > 1:  # each layer adds alike: a line through the two depths
            depth = self.model.depth or 0
            total = _line(totals[0], totals[1], *PROXY_LAYERS, depth)
            # Layers as leaves of their own leave the largest leaf alone; layers stacked in
            # one leaf (for a scan) grow it with the depth.
            stacked = len(per_depth[0]) == len(per_depth[1])
            grown = _line(largests[0], largests[1], *PROXY_LAYERS, depth)
            largest = grown if stacked else max(largests)
        offchip = bool(pipeline and pipeline.optimizer_state_offchip)
        return InputBytes(total, largest, offchip, self.samples(args, kwargs))

    def cost(self, candidate: Candidate, whole: bool = False) -> Plan | str:
        """The candidate costed (extrapolated from shallow copies unless `whole`), or why it
        could not be."""
        reports = []
        for layers in (None,) if whole else self.depths(candidate):
            try:
                fun, args, kwargs = self.built(candidate, layers)
                self.compiles += 1
                lowered = jit(fun, **kwargs).lower(*args)
                reports.append(lowered.compile(check_memory_fits=False).cost_report())
            except SKIP_ERRORS as error:
                return _first_line(error)
        full = functools.partial(self.built, candidate, None)
        samples = self.samples(args, kwargs)
        return _plan(candidate, reports, self.model.depth, samples, full, kwargs.get("pipeline"))

    def try_plain(
        self, candidate: Candidate, inputs: InputBytes | str | None = None
    ) -> tuple[str, InputBytes | None]:
        """Costs the candidate unless a bound rules it out: 'fits', 'too big', 'memory bound'
        or 'not expressible', and its inputs when known (`inputs`: when the caller has them)."""
        inputs = self.inputs(candidate) if inputs is None else inputs
        if isinstance(inputs, str):
            self.skip(candidate, "not expressible", inputs)
            return "not expressible", None
        why = memory_bound(candidate, inputs, self.target)
        if why is not None:
            self.skip(candidate, "memory bound", why)
            return "memory bound", inputs
        self.note(f"costing {candidate.describe()}")
        plan = self.cost(candidate)
        if isinstance(plan, str):
            self.skip(candidate, "not expressible", plan)
            return "not expressible", inputs
        self.plans.append(plan)
        return ("fits" if plan.fits else "too big"), inputs

    def run(self, candidates: Sequence[Candidate]) -> None:
        """Plain plans first (they say which meshes need phases), a pipeline stashing before
        it recomputes; then phased plans, best bound first."""
        phased: list[tuple[Candidate, InputBytes]] = []
        for candidate in candidates:
            if candidate.pipelined:
                self.run_pipelined(candidate)
                continue
            outcome, inputs = self.try_plain(candidate)
            if outcome in ("too big", "memory bound") and inputs is not None:
                phased.append((dataclasses.replace(candidate, phases="auto"), inputs))
            elif outcome == "fits":
                self.skip(
                    dataclasses.replace(candidate, phases="auto"),
                    "dominated",
                    "the plan without phases fits, and phases only add streaming",
                )
        self.run_phased(phased)

    def run_pipelined(self, candidate: Candidate) -> None:
        counts = self.counts(candidate) if self.model.choose_microbatches else [None]
        inputs = None  # the same whatever the micro-batches and recomputation
        for count in counts:
            stashing = dataclasses.replace(candidate, microbatches=count, recompute=False)
            outcome, inputs = self.try_plain(stashing, inputs)
            if outcome in ("not expressible", "memory bound"):
                break  # the same for every count: the rule, the scopes or the weights
            if outcome == "too big":
                self.try_plain(dataclasses.replace(stashing, recompute=True), inputs)
            elif outcome == "fits":
                self.skip(
                    dataclasses.replace(stashing, recompute=True),
                    "dominated",
                    "the pipeline that stashes fits, and recomputation only adds compute",
                )

    def counts(self, candidate: Candidate) -> list[int | None]:
        """Micro-batch counts for a pipelined mesh of a fixed global batch: each replica's batch
        cut into micro-batches of `MICRO_BATCH_SIZES` samples, at least one per stage."""
        try:
            _, (_, args, kwargs) = self.make(candidate, None)
        except SKIP_ERRORS:
            return [None]
        per_replica = self.samples(args, kwargs) // candidate.mesh.get(REPLICAS, 1)
        stages = candidate.mesh[PIPELINE_AXIS]
        counts: list[int | None] = [
            per_replica // m
            for m in MICRO_BATCH_SIZES
            if per_replica % m == 0 and per_replica // m >= stages
        ]
        return counts or [None]

    def run_phased(self, needs: list[tuple[Candidate, InputBytes]]) -> None:
        bounded = []
        for candidate, inputs in needs:
            why = memory_bound(candidate, inputs, self.target)
            if why is not None:
                self.skip(candidate, "memory bound", why)
                continue
            seconds = max(streaming_bound_seconds(inputs, self.target), 1e-12)
            bounded.append((inputs.samples / seconds, candidate))
        bounded.sort(key=lambda item: -item[0])
        for rate, candidate in bounded:
            best = self.best_fitting_rate()
            if best is not None and rate < best:
                self.skip(
                    candidate,
                    "cost bound",
                    f"streaming its inputs alone allows at most {rate:,.3g} samples/s, below "
                    f"the best plan's {best:,.3g}",
                )
                continue
            self.note(f"costing {candidate.describe()}")
            plan = self.cost(candidate)
            if isinstance(plan, str):
                self.skip(candidate, "not expressible", plan)
            else:
                self.plans.append(plan)

    def best_fitting_rate(self) -> float | None:
        rates = [p.samples_per_second for p in self.plans if p.fits]
        return max(rates) if rates else None

    def confirm(self, count: int) -> None:
        """Compiles the best extrapolated plans whole until the best is exact (at most
        `count` of them), each replacing its estimate."""
        for _ in range(count):
            ranked = rank(self.plans)
            if not ranked or not ranked[0].extrapolated:
                return
            top = ranked[0]
            self.note(f"confirming {top.candidate.describe()} at full depth")
            whole = self.cost(top.candidate, whole=True)
            self.plans.remove(top)
            if isinstance(whole, str):
                self.skip(top.candidate, "not expressible", whole)
            else:
                self.plans.append(whole)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def rank(plans: Sequence[Plan]) -> list[Plan]:
    """Fitting plans first, each group by samples per second, fastest first."""
    return sorted(plans, key=lambda p: (not p.fits, -p.samples_per_second))


def _line(at_l1: float, at_l2: float, l1: int, l2: int, depth: int) -> float:
    return at_l1 + (depth - l1) * (at_l2 - at_l1) / (l2 - l1)


def _plan(
    candidate: Candidate,
    reports: list[Any],
    depth: int | None,
    samples: int,
    build: Callable[[], tuple[Callable[..., Any], tuple, dict[str, Any]]],
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


def search(
    model: Model,
    system: str,
    target: Target | None = None,
    layouts: Sequence[tuple[str, ...]] = LAYOUTS,
    confirm: int = 2,
    progress: Callable[[str], None] | None = None,
) -> Plans:
    """Every plan of `model` on `system` (see the module docstring), ranked."""
    ipus = system_ipus(system)
    target = target or Target.bow()
    state = _Search(model, target, progress=progress)
    state.run([Candidate(axes) for axes in meshes(ipus, layouts)])
    state.confirm(confirm)
    return Plans(
        system=system,
        ipus=ipus,
        target=target.name,
        plans=tuple(rank(state.plans)),
        skipped=tuple(state.skipped),
        compiles=state.compiles,
    )


# ---- the API ---------------------------------------------------------------------------------


def data_parallel(mesh: Mesh, args: tuple, batch_argnums: Sequence[int]) -> tuple:
    """The default rule: the batch arguments split over `dp` along their leading dimension,
    every other argument whole on every IPU (a pipeline's stages are its named scopes, so `pp`
    needs no spec); a mesh with tensor-parallel axes is not expressible."""
    others = sorted(set(mesh.axis_names) - {REPLICAS, PIPELINE_AXIS})
    if others:
        raise ConfigError(
            f"the default rule is data parallel only and cannot use mesh axes {others}; pass "
            "rule=lambda mesh: in_shardings to ipujax.plan for tensor parallelism"
        )
    positions = {i % len(args) for i in batch_argnums}

    def spec(i: int, arg: Any) -> Any:
        if i not in positions or mesh.shape.get(REPLICAS, 1) == 1:
            return jax.tree.map(lambda _: PartitionSpec(), arg)
        return jax.tree.map(lambda _: PartitionSpec(REPLICAS), arg)

    return tuple(spec(i, a) for i, a in enumerate(args))


def plan(
    fun: Callable[..., Any],
    *args: Any,
    system: str = "pod16",
    target: Target | None = None,
    rule: Callable[[Mesh], Any] | None = None,
    batch_argnums: Sequence[int] = (-1,),
    layouts: Sequence[tuple[str, ...]] = LAYOUTS,
    progress: Callable[[str], None] | None = None,
) -> Plans:
    """The ways to run `fun(*args)` on every IPU of `system` (`pod16`, `pod64`, `pod256`, `bow`
    for a Bow-2000, `ipu`, or a count), costed and ranked (docs/plan.md).

    `rule(mesh)` gives `in_shardings` for `args` on a mesh whose axes are among `dp`, `tp`,
    `tp1`, `tp2` and `pp` (raising `ValueError` for one it cannot shard); by default the batch
    arguments are split over `dp` and everything else replicated. A mesh with `pp` pipelines the
    step over it by its `jax.named_scope` blocks, trying micro-batches of 1 to 32 samples. The
    batch is `args`' own: every plan trains on the same samples a step.

        plans = ipujax.plan(step, params, opt_state, batch, system="pod16", rule=my_specs)
        step_on_pod = plans.best.jit(step)
    """

    def make(mesh: Mesh, layers: int | None) -> tuple[Callable[..., Any], tuple, dict[str, Any]]:
        in_shardings = rule(mesh) if rule is not None else data_parallel(mesh, args, batch_argnums)
        return fun, args, {"in_shardings": in_shardings}

    model = Model(make, batch_argnums=tuple(batch_argnums), choose_microbatches=True)
    return search(model, system, target, layouts, progress=progress)


def workload_model(factory: Callable[..., Any], call: Callable[..., tuple]) -> Model:
    """A model from a workload factory (the CLI's `path.py:NAME`), called through `call(mesh,
    **extra)`: each mesh gets the factory's own shardings, batch and pipeline; a factory with a
    `layers` keyword whose default is an integer is costed shallow and extrapolated."""
    depth = _depth(factory)

    def make(mesh: Mesh, layers: int | None) -> tuple[Callable[..., Any], tuple, dict[str, Any]]:
        extra = {} if layers is None else {"layers": layers}
        return call(mesh, **extra)

    return Model(make, depth=depth)


def _depth(factory: Callable[..., Any]) -> int | None:
    try:
        parameter = inspect.signature(factory).parameters.get("layers")
    except (TypeError, ValueError):
        return None
    if parameter is None or not isinstance(parameter.default, int):
        return None
    return int(parameter.default)


__all__ = [
    "Candidate",
    "Model",
    "Plan",
    "Plans",
    "Skipped",
    "meshes",
    "plan",
    "rank",
    "search",
    "system_ipus",
    "workload_model",
]

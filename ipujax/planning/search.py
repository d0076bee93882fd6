"""The plan search's loop: which candidates to cost, in which order, and which to skip.

The search does not cost every plan. In order:
- **Not expressible.** The rule (or workload) raises `ValueError` or an ipujax error for a mesh
  it cannot shard (heads that do not divide, an axis it does not know): skipped, with its words.
- **Memory lower bounds, before anything is traced** (`bounds`): a plan whose inputs alone
  cannot fit is skipped.
- **Dominance.** Phases only add streaming and recomputation only adds compute, so a phased plan
  is costed only for a mesh whose plain plan does not fit, and a pipeline that recomputes only
  when the one that stashes does not fit.
- **A pipeline's stash, before its stages' memory is swept.** A pipeline is partitioned,
  scheduled and split into stages first (`partitioner.pipeline_peak_floor`): when a stage's
  stash for its micro-batches in flight is over a tile's memory by itself, the fullest tile its
  build would report is too, and it is skipped (`stash_bound=False` builds it anyway).
- **A cost lower bound.** A phased plan streams every input byte of an IPU in at least once a
  step: its samples per second are at most samples / (bytes per IPU / streaming bandwidth).
  Phased plans are costed best bound first; one whose bound is below the best plan that fits so
  far is pruned.
- **Repeated layers priced once** (`costing`): a layered model is costed shallow and
  extrapolated; the best plans are then compiled whole (`confirm`), and their figures replace
  the estimates. A last batch of phased plans that leaves a worker idle has it compile the best
  plan so far whole (`ahead_of_confirm`), which `confirm` takes if it asks for that plan.
- **Side by side** (`workers`): with `jobs` > 1 and a model that can be made again in another
  process, the unphased meshes are visited in worker processes and the phased plans costed
  as many at a time as there are workers, a plan that the ones before it would have pruned
  pruned after it is costed: the plans and skips are those of one process.
- **Traced once** (`traces`): the variants of a mesh share its trace, meshes whose arguments
  have the same shapes share one when the step is alike and reads no mesh axis, and a
  pipeline is traced at its micro-batch alone; a pipelined mesh's bound and its builds
  (stashing, recomputing) share its staged program (`partitioner.reusing`); `reuse=False`
  lowers and builds each compile through `ipujax.jit` instead (the same ranking, slower: a
  check on the reuse).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ipujax.boundary import collector_paused
from ipujax.planning.bounds import InputBytes, memory_bound, streaming_bound_seconds
from ipujax.planning.candidates import (
    LAYOUTS,
    PIPELINE_AXIS,
    REPLICAS,
    Candidate,
    meshes,
    microbatch_counts,
    system_ipus,
)
from ipujax.planning.costing import SKIP_ERRORS, Costing, Refused
from ipujax.planning.models import Model, step_model
from ipujax.planning.ranking import Plan, Plans, Skipped, rank
from ipujax.planning.traces import Traces
from ipujax.planning.workers import Workers
from lowering import KeptImports, imports_reused
from partitioner import Mesh, Target, reusing


class Outcome(enum.Enum):
    """What trying a candidate came to, which says what the search tries next for its mesh."""

    FITS = enum.auto()  # costed, and it fits
    DOES_NOT_FIT = enum.auto()  # costed, and over the chip's memory
    OVER_MEMORY_BOUND = enum.auto()  # not costed: its inputs alone cannot fit
    OVER_STASH_BOUND = enum.auto()  # not costed: a pipeline whose stash alone cannot fit
    REFUSED = enum.auto()  # not costed: the rule cannot shard its mesh


# A plain plan that cannot fit, costed or not: phases may make it fit.
_OUTGROWN = frozenset({Outcome.DOES_NOT_FIT, Outcome.OVER_MEMORY_BOUND})
# The same for every micro-batch count of a pipeline: the rule, the scopes or the weights.
_EVERY_COUNT = frozenset({Outcome.REFUSED, Outcome.OVER_MEMORY_BOUND})
# A pipeline that stashes and cannot fit, costed or not: recomputation may make it fit.
_OVERSTASHED = frozenset({Outcome.DOES_NOT_FIT, Outcome.OVER_STASH_BOUND})


# What a worker does with a candidate: visit it (`_Search.visit`), cost it (a phased plan), or
# compile it whole (`_Search.confirm`, ahead of time, on a worker the last batch leaves idle).
_VISIT, _COST, _CONFIRM = "visit", "cost", "confirm"


@dataclass(frozen=True)
class _Done:
    """A job a worker did: its plans (without their builders, which do not pickle), skips,
    the phased plans it calls for and its compiles."""

    plans: tuple[Plan, ...]
    skipped: tuple[Skipped, ...]
    phased: tuple[tuple[Candidate, InputBytes], ...]
    compiles: int


@dataclass
class _Search:
    """One search's state: the plans it costed and the candidates it skipped, in order."""

    costing: Costing
    progress: Callable[[str], None] | None = None
    stash_bound: bool = True  # pipelines ruled out by their stash before they are built
    plans: list[Plan] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    workers: Workers | None = None  # None: every candidate costed in this process
    confirms: int = 0  # how many plans `confirm` may compile whole (none: none made ahead)
    # Whole compiles a worker made ahead of `confirm`, by candidate: used when it asks for one.
    ahead: dict[Candidate, _Done] = field(default_factory=dict)

    def note(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)

    def skip(self, candidate: Candidate, reason: str, detail: str) -> None:
        self.skipped.append(Skipped(candidate, reason, detail))

    def attempt(self, candidate: Candidate, whole: bool = False) -> Plan | None:
        """The candidate costed, or None when it could not be (skipped, with why)."""
        plan = self.costing.cost(candidate, whole)
        if isinstance(plan, Refused):
            self.skip(candidate, "not expressible", plan.detail)
            return None
        return plan

    def try_plain(
        self, candidate: Candidate, inputs: InputBytes | None = None
    ) -> tuple[Outcome, InputBytes | None]:
        """Costs the candidate unless a bound rules it out, and its inputs when known
        (`inputs`: when the caller has them)."""
        known = self.costing.inputs(candidate) if inputs is None else inputs
        if isinstance(known, Refused):
            self.skip(candidate, "not expressible", known.detail)
            return Outcome.REFUSED, None
        why = memory_bound(candidate, known, self.costing.target)
        if why is not None:
            self.skip(candidate, "memory bound", why)
            return Outcome.OVER_MEMORY_BOUND, known
        if candidate.pipelined and self.stash_bound:
            stashed = self.over_stash_bound(candidate)
            if stashed is not None:
                return stashed, known
        self.note(f"costing {candidate.describe()}")
        plan = self.attempt(candidate)
        if plan is None:
            return Outcome.REFUSED, known
        self.plans.append(plan)
        return (Outcome.FITS if plan.fits else Outcome.DOES_NOT_FIT), known

    def over_stash_bound(self, candidate: Candidate) -> Outcome | None:
        """Why a pipeline is not built when its program, scheduled and split into stages,
        shows that a stage's stash for its micro-batches in flight is over a tile's memory
        alone (`partitioner.pipeline_peak_floor`), or its passes refused it; None if it may
        fit."""
        floor = self.costing.peak_floor(candidate)
        if isinstance(floor, Refused):
            self.skip(candidate, "not expressible", floor.detail)
            return Outcome.REFUSED
        tile = self.costing.target.bytes_per_tile
        if floor.bytes <= tile:
            return None
        self.skip(
            candidate,
            "memory bound",
            f"stage {floor.stage} stashes {floor.bytes:,} B on tile {floor.tile} for its "
            f"micro-batches in flight, over the tile's {tile:,} B",
        )
        return Outcome.OVER_STASH_BOUND

    def run(self, candidates: Sequence[Candidate]) -> None:
        """Each candidate on its own (plain plans say which meshes need phases, a pipeline
        stashes before it recomputes), side by side in the workers when there are; then
        phased plans, best bound first."""
        phased: list[tuple[Candidate, InputBytes]] = []
        jobs = [(candidate, _VISIT) for candidate in candidates]
        for candidate, done in zip(candidates, self.farmed(jobs), strict=True):
            phased += self.visit(candidate) if done is None else self.absorb(done)
        self.run_phased(phased)

    def visit(self, candidate: Candidate) -> list[tuple[Candidate, InputBytes]]:
        """Tries an unphased candidate (a pipeline: its micro-batch counts and recomputation),
        returning the phased plan it calls for, if any, with its inputs."""
        if candidate.pipelined:
            self.run_pipelined(candidate)
            return []
        outcome, inputs = self.try_plain(candidate)
        if outcome in _OUTGROWN and inputs is not None:
            return [(candidate.phased(), inputs)]
        if outcome is Outcome.FITS:
            self.skip(
                candidate.phased(),
                "dominated",
                "the plan without phases fits, and phases only add streaming",
            )
        return []

    def cost_one(self, candidate: Candidate) -> None:
        self.note(f"costing {candidate.describe()}")
        plan = self.attempt(candidate)
        if plan is not None:
            self.plans.append(plan)

    def farmed(self, jobs: list[tuple[Candidate, str]]) -> list[_Done | None]:
        """Each job as a worker did it, or None where the search is to do it itself (no
        workers, a single job, or a job or the pool that failed: done again here, an error
        is raised where it arises)."""
        workers = self.workers
        done = workers.costed(jobs) if workers is not None and len(jobs) > 1 else None
        return done if done is not None else [None] * len(jobs)

    def absorb(self, done: _Done) -> list[tuple[Candidate, InputBytes]]:
        """A worker's plans and skips as the search's own, in the order the jobs were given;
        the phased plans its candidate calls for."""
        self.plans += [self.buildable(p) for p in done.plans]
        self.skipped += done.skipped
        self.costing.compiles += done.compiles
        return list(done.phased)

    def buildable(self, plan: Plan) -> Plan:
        """A worker's plan (whose builder does not pickle) with the search's builder."""
        return dataclasses.replace(
            plan, build=functools.partial(self.costing.built, plan.candidate, None)
        )

    def run_pipelined(self, candidate: Candidate) -> None:
        choose = self.costing.model.choose_microbatches
        counts = self.counts(candidate) if choose else [None]
        inputs = None  # the same whatever the micro-batches and recomputation
        for count in counts:
            stashing = candidate.stashing(count)
            outcome, inputs = self.try_plain(stashing, inputs)
            if outcome in _EVERY_COUNT:
                break
            if outcome in _OVERSTASHED:
                self.try_plain(stashing.recomputing(), inputs)
            elif outcome is Outcome.FITS:
                self.skip(
                    stashing.recomputing(),
                    "dominated",
                    "the pipeline that stashes fits, and recomputation only adds compute",
                )

    def counts(self, candidate: Candidate) -> list[int | None]:
        """Micro-batch counts for a pipelined mesh of the model's global batch."""
        try:
            _, (_, args, kwargs) = self.costing.make(candidate, None)
        except SKIP_ERRORS:
            return [None]
        per_replica = self.costing.samples(args, kwargs) // candidate.mesh.get(REPLICAS, 1)
        return microbatch_counts(per_replica, candidate.mesh[PIPELINE_AXIS])

    def run_phased(self, needs: list[tuple[Candidate, InputBytes]]) -> None:
        """Phased plans best bound first, each pruned when its bound is below the best plan
        that fits so far. With workers, as many at a time as there are workers; a plan the
        ones before it in the same batch would have pruned is pruned (its compile wasted), so
        the plans and skips are those of one at a time."""
        pending = self.bounded(needs)
        width = self.workers.jobs if self.workers is not None else 1
        while pending:
            batch: list[tuple[float, Candidate]] = []
            while pending and len(batch) < width:
                rate, candidate = pending.pop(0)
                if not self.cost_bounded(rate, candidate):
                    batch.append((rate, candidate))
            jobs = [(candidate, _COST) for _, candidate in batch]
            ahead = self.ahead_of_confirm(batch, width) if not pending else None
            done_jobs = self.farmed(jobs + ([(ahead, _CONFIRM)] if ahead is not None else []))
            if ahead is not None and done_jobs[-1] is not None:
                self.ahead[ahead] = done_jobs[-1]
                self.costing.compiles += done_jobs[-1].compiles
            for (rate, candidate), done in zip(batch, done_jobs[: len(batch)], strict=True):
                if self.cost_bounded(rate, candidate):
                    self.costing.compiles += done.compiles if done is not None else 0
                elif done is None:
                    self.cost_one(candidate)
                else:
                    self.absorb(done)

    def ahead_of_confirm(
        self, batch: list[tuple[float, Candidate]], width: int
    ) -> Candidate | None:
        """The plan `confirm` would compile whole first if the search ended now, when the last
        batch leaves a worker idle (None otherwise): compiled whole beside the batch, its
        figures are `confirm`'s if it still asks for them, and are dropped if not."""
        if self.workers is None or len(batch) >= width or self.confirms <= 0:
            return None
        ranked = rank(self.plans)
        if not ranked or not ranked[0].extrapolated:
            return None
        return ranked[0].candidate

    def cost_bounded(self, rate: float, candidate: Candidate) -> bool:
        """Whether the best plan that fits so far prunes a phased candidate whose bound is
        `rate` samples/s (and if so, it is skipped, with why)."""
        best = self.best_fitting_rate()
        if best is None or rate >= best:
            return False
        self.skip(
            candidate,
            "cost bound",
            f"streaming its inputs alone allows at most {rate:,.3g} samples/s, below "
            f"the best plan's {best:,.3g}",
        )
        return True

    def bounded(self, needs: list[tuple[Candidate, InputBytes]]) -> list[tuple[float, Candidate]]:
        """The phased candidates that may fit, each with the samples per second streaming its
        inputs allows at most, best first."""
        target = self.costing.target
        bounded = []
        for candidate, inputs in needs:
            why = memory_bound(candidate, inputs, target)
            if why is not None:
                self.skip(candidate, "memory bound", why)
                continue
            seconds = max(streaming_bound_seconds(inputs, target), 1e-12)
            bounded.append((inputs.samples / seconds, candidate))
        bounded.sort(key=lambda item: -item[0])
        return bounded

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
            whole = self.whole(top.candidate)
            self.plans.remove(top)
            if whole is not None:
                self.plans.append(whole)

    def whole(self, candidate: Candidate) -> Plan | None:
        """The candidate compiled whole: as a worker compiled it ahead (`ahead_of_confirm`), or
        here; None when it could not be (skipped, with why)."""
        done = self.ahead.pop(candidate, None)
        if done is None:
            return self.attempt(candidate, whole=True)
        self.skipped += done.skipped  # its compiles were counted when it was made
        return self.buildable(done.plans[0]) if done.plans else None


def _worker(
    remake: Callable[[], Model],
    target: Target,
    stash_bound: bool,
    reuse: bool,
    progress: Callable[[str], None] | None,
) -> Callable[[tuple[Candidate, str]], _Done | None]:
    """A worker's setup: the model made again in the worker, and its job, a candidate visited
    or costed by a search of its own (None when it raised: the parent does it again itself).
    Reusing, the importer's graphs are kept across the worker's jobs (`imports`), as the
    search's block keeps them across its candidates (meshes of the same replicas lower to the
    same module), and so are the traces of steps alike (`traces`); what else the passes keep
    (`reusing`) lasts a job, which is one mesh."""
    model = remake()
    imports = KeptImports()
    alike: dict = {}  # traces shared by steps alike, across the worker's jobs (`Traces`)

    def kept() -> contextlib.AbstractContextManager[Any]:
        if not reuse:
            return contextlib.nullcontext()
        block = contextlib.ExitStack()
        block.enter_context(imports_reused(imports))
        block.enter_context(reusing())  # its imports are the block's around it: `imports`
        return block

    def job(work: tuple[Candidate, str]) -> _Done | None:
        candidate, kind = work
        costing = Costing(model, target, traces=Traces(alike=alike) if reuse else None)
        state = _Search(costing, progress, stash_bound=stash_bound)
        try:
            with collector_paused(), kept():
                phased = []
                if kind == _VISIT:
                    phased = state.visit(candidate)
                elif kind == _CONFIRM:
                    whole = state.attempt(candidate, whole=True)
                    state.plans += [whole] if whole is not None else []
                else:
                    state.cost_one(candidate)
        except Exception:  # raised again where the parent does the job itself, typed
            return None
        plans = tuple(dataclasses.replace(p, build=None) for p in state.plans)
        return _Done(plans, tuple(state.skipped), tuple(phased), state.costing.compiles)

    return job


def search(
    model: Model,
    system: str,
    target: Target | None = None,
    layouts: Sequence[tuple[str, ...]] = LAYOUTS,
    confirm: int = 2,
    progress: Callable[[str], None] | None = None,
    reuse: bool = True,
    stash_bound: bool = True,
    jobs: int = 1,
) -> Plans:
    """Every plan of `model` on `system` (see the module docstring), ranked. `reuse=False`
    traces and builds every compile afresh through `ipujax.jit` (the same ranking, slower);
    `stash_bound=False` builds the pipelines that a stash over a tile's memory rules out
    (the same plans, and those that do not fit). `jobs` > 1 costs candidates in that many
    worker processes when the model can be made again in one (`Model.remake`, and a
    `progress` that pickles): the same plans and skips."""
    ipus = system_ipus(system)
    target = target or Target.bow()
    traces = Traces() if reuse else None
    costing = Costing(model, target, traces=traces)
    state = _Search(costing, progress, stash_bound=stash_bound, confirms=confirm)
    if jobs > 1 and model.remake is not None:
        setup = functools.partial(_worker, model.remake, target, stash_bound, reuse, progress)
        state.workers = Workers(jobs, setup)
    # The collector paused throughout, as each compile pauses it (`ipujax.boundary`): between
    # compiles the workload's own code (its shapes, made per mesh) ran with the search's traces
    # and programs in memory, and the collector's sweeps over them were most of its time.
    with collector_paused(), reusing() if reuse else contextlib.nullcontext():
        try:
            state.run([Candidate(axes) for axes in meshes(ipus, layouts)])
        finally:
            if state.workers is not None:
                state.workers.close()
        state.confirm(confirm)
    if traces is not None:
        traces.clear()  # the plans keep their builders, not the search's traces
    return Plans(
        system=system,
        ipus=ipus,
        target=target.name,
        plans=tuple(rank(state.plans)),
        skipped=tuple(state.skipped),
        compiles=state.costing.compiles,
    )


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
    model = step_model(fun, args, rule, batch_argnums)
    return search(model, system, target, layouts, progress=progress)

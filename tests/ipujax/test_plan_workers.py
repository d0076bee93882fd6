"""The plan search in worker processes finds what it finds in one: the same plans with the same
figures, the same skips with the same words, in the same order, and the same compiles.

Candidates that do not depend on one another go to the workers (`planning.workers`); phased
plans go as many at a time as there are workers, and a plan that the plans before it would
have pruned one at a time is pruned after it is costed. A pool that cannot start or dies
leaves the work to the search itself, with a warning.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lowering.importer
from ipujax.cli import main
from ipujax.cli.plan import spec_model
from ipujax.planning import Candidate, Plan, Plans, search
from ipujax.planning.ranking import rank
from ipujax.planning.search import _Done, _Search, _worker
from partitioner import Target

ROOT = Path(__file__).resolve().parents[2]
TINY = f"{ROOT}/examples/gpt/workloads.py:tiny"


@pytest.fixture(scope="module")
def alone() -> Plans:
    """The tiny GPT's plans on a Bow-2000 (pipelines among them), searched in one process;
    `sys.path` left as it was (loading a spec file puts its folder there)."""
    path = [*sys.path]
    try:
        return search(spec_model(TINY), "bow", confirm=0, jobs=1)
    finally:
        sys.path[:] = path


def _found_plans(done: _Done) -> list[dict[str, Any]]:
    return [p.to_dict() for p in done.plans]


def _found(plans: Plans) -> dict[str, Any]:
    """Everything a search reports, as its JSON says it."""
    return json.loads(json.dumps(plans.to_dict()))


def test_workers_find_what_one_process_finds(alone: Plans, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", [*sys.path])
    visited: list[Candidate] = []
    original = _Search.visit

    def visit(self: _Search, candidate: Candidate) -> Any:
        visited.append(candidate)
        return original(self, candidate)

    # The workers are processes of their own: this process visits nothing while they work.
    monkeypatch.setattr(_Search, "visit", visit)
    farmed = search(spec_model(TINY), "bow", confirm=0, jobs=2)
    assert visited == []
    assert _found(farmed) == _found(alone)
    assert any(p.candidate.pipelined for p in farmed.plans)
    # A worker's plan is applied as the search's own: its builder makes the mesh's step.
    best = farmed.best
    assert best.jit_kwargs["mesh"].shape == best.mesh


def test_a_pool_that_cannot_start_leaves_the_work_to_the_search(
    alone: Plans, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", [*sys.path])
    model = spec_model(TINY)
    unpicklable = dataclasses.replace(model, remake=lambda: model)
    with pytest.warns(RuntimeWarning, match="worker processes stopped"):
        fallen = search(unpicklable, "bow", confirm=0, jobs=2)
    assert _found(fallen) == _found(alone)


def test_a_model_without_remake_stays_in_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", [*sys.path])
    model = dataclasses.replace(spec_model(TINY), remake=None)

    def no_pool(*args: Any) -> Any:
        raise AssertionError("no worker processes for a model that cannot be made again")

    # `ipujax.planning.search` is the function; its module, by name
    monkeypatch.setattr(importlib.import_module("ipujax.planning.search"), "Workers", no_pool)
    assert search(model, "ipu", confirm=0, jobs=2).plans


# ---- phased plans, as many at a time as there are workers ---------------------------------


def _candidate(i: int) -> Candidate:
    return Candidate((("dp", i),), phases="auto")


def _plan(candidate: Candidate, rate: float) -> Plan:
    return Plan(candidate, 1.0 / rate, 1, True, 0, 1, 0.0, 0.0, False)


@dataclasses.dataclass
class _Costing:
    """What `_Search` reads of its costing, each plan's samples per second given."""

    rates: dict[Candidate, float]
    compiles: int = 0

    def cost(self, candidate: Candidate, whole: bool = False) -> Plan:
        self.compiles += 2
        return _plan(candidate, self.rates[candidate])

    def built(self, candidate: Candidate, layers: int | None) -> Any:
        return None, (), {}


@dataclasses.dataclass
class _Workers:
    """Workers in this process: each job costed as a worker costs it."""

    jobs: int
    rates: dict[Candidate, float]
    broken: BaseException | None = None

    def costed(self, jobs: list[tuple[Candidate, str]]) -> list[_Done]:
        return [_Done((_plan(c, self.rates[c]),), (), (), 2) for c, _ in jobs]


def _phased(
    cases: list[tuple[float, float]], width: int | None, monkeypatch: pytest.MonkeyPatch
) -> _Search:
    """A search's phased pass over candidates whose (bound, samples/s) are `cases`, alone
    (`width` None) or `width` at a time."""
    candidates = [_candidate(i + 1) for i in range(len(cases))]
    bounded = sorted(
        ((b, c) for (b, _), c in zip(cases, candidates, strict=True)), key=lambda b: -b[0]
    )
    rates = {c: rate for (_, rate), c in zip(cases, candidates, strict=True)}
    monkeypatch.setattr(_Search, "bounded", lambda self, needs: list(bounded))
    workers = None if width is None else _Workers(width, rates)
    state = _Search(_Costing(rates), workers=workers)  # type: ignore[arg-type]
    state.run_phased([])
    return state


def test_a_plan_costed_beside_one_that_prunes_it_is_pruned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One at a time the first plan (129.5 samples/s) prunes the second (bound 129); two at a
    # time both are costed, and the second is pruned after.
    cases = [(130.0, 129.5), (129.0, 50.0), (100.0, 90.0)]
    alone = _phased(cases, None, monkeypatch)
    two = _phased(cases, 2, monkeypatch)
    assert [p.candidate for p in alone.plans] == [_candidate(1)]
    assert [s.candidate for s in alone.skipped] == [_candidate(2), _candidate(3)]
    assert all(s.reason == "cost bound" for s in alone.skipped)
    assert (two.plans, two.skipped) == (alone.plans, alone.skipped)
    assert (alone.costing.compiles, two.costing.compiles) == (2, 4)


@settings(max_examples=60, deadline=None)
@given(
    cases=st.lists(
        st.tuples(st.floats(1, 1e3), st.floats(0.05, 1.0)).map(lambda c: (c[0], c[0] * c[1])),
        max_size=8,
    ),
    width=st.integers(1, 4),
)
def test_phased_plans_side_by_side_are_those_of_one_at_a_time(
    cases: list[tuple[float, float]], width: int
) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        alone = _phased(cases, None, monkeypatch)
        side_by_side = _phased(cases, width, monkeypatch)
    assert side_by_side.plans == alone.plans
    assert side_by_side.skipped == alone.skipped
    assert side_by_side.costing.compiles >= alone.costing.compiles


def test_workers_plans_get_the_searchs_builder() -> None:
    rates = {_candidate(1): 10.0}
    state = _Search(_Costing(rates))  # type: ignore[arg-type]
    state.absorb(_Done((_plan(_candidate(1), 10.0),), (), (), 2))
    (plan,) = state.plans
    assert isinstance(plan.build, functools.partial)
    assert plan.build() == (None, (), {})
    assert state.costing.compiles == 2


def test_jobs_below_one_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", [*sys.path])
    code = main(["plan", TINY, "--system", "bow", "--jobs", "0", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("ipujax: error: --jobs 0") and "Traceback" not in err
    assert out == ""


def test_an_error_in_a_worker_is_raised_by_the_search_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not a refusal the search skips: it is raised, as in one process, from the search's own
    # attempt at the job (typed, with its traceback), not as a worker's pickled copy.
    monkeypatch.setattr(sys, "path", [*sys.path])
    workload = tmp_path / "broken.py"
    workload.write_text(
        "def step(mesh=None):\n    raise RuntimeError(f'broken workload on {dict(mesh.shape)}')\n"
    )
    with pytest.raises(RuntimeError, match="broken workload on"):
        search(spec_model(f"{workload}:step"), "bow", confirm=0, jobs=2)


def test_a_worker_keeps_its_imports_across_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two jobs on the same mesh lower the same module: the second reuses the first's import.
    monkeypatch.setattr(sys, "path", [*sys.path])
    imported: list[Any] = []
    main = lowering.importer._Importer.main

    def counted(self: Any) -> Any:
        imported.append(self)
        return main(self)

    monkeypatch.setattr(lowering.importer._Importer, "main", counted)
    job = _worker(functools.partial(spec_model, TINY), Target.bow(), True, True, None)
    first, again = (job((Candidate((("dp", 4),)), "visit")) for _ in range(2))
    assert first is not None and again is not None
    assert _found_plans(first) == _found_plans(again)
    assert len(imported) == 1


@dataclasses.dataclass
class _Layered:
    """A layered model's costing: shallow estimates, and whole compiles that read `whole`
    samples/s (counted)."""

    shallow: dict[Candidate, float]
    whole: dict[Candidate, float]
    compiles: int = 0
    wholes: list[Candidate] = dataclasses.field(default_factory=list)

    def cost(self, candidate: Candidate, whole: bool = False) -> Plan:
        self.compiles += 1 if whole else 2
        if whole:
            self.wholes.append(candidate)
        rate = (self.whole if whole else self.shallow)[candidate]
        return dataclasses.replace(_plan(candidate, rate), extrapolated=not whole)

    def built(self, candidate: Candidate, layers: int | None) -> Any:
        return None, (), {}


@dataclasses.dataclass
class _LayeredWorkers:
    """Workers in this process that cost and compile whole as `costing` does."""

    jobs: int
    costing: _Layered

    def costed(self, jobs: list[tuple[Candidate, str]]) -> list[_Done]:
        out = []
        for candidate, kind in jobs:
            before = self.costing.compiles
            plan = self.costing.cost(candidate, whole=kind == "confirm")
            out.append(_Done((plan,), (), (), self.costing.compiles - before))
        return out


@pytest.mark.parametrize("whole_rate", [9.0, 3.0], ids=["stays-best", "falls-behind"])
def test_the_last_batch_compiles_the_best_plan_whole_on_the_idle_worker(
    whole_rate: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three phased candidates, two workers: the last batch holds one, and the other worker
    # compiles the best plan so far whole. `confirm` takes that compile rather than making
    # it again (and when it falls behind, confirms the next one itself): the plans of one
    # process, one whole compile fewer made after the search.
    shallow = {_candidate(1): 10.0, _candidate(2): 8.0, _candidate(3): 5.0}
    whole = {_candidate(1): whole_rate, _candidate(2): 7.0, _candidate(3): 4.0}
    bounded = [(100.0, c) for c in shallow]
    monkeypatch.setattr(_Search, "bounded", lambda self, needs: list(bounded))
    results = []
    for width in (None, 2):
        costing = _Layered(shallow, whole)
        workers = None if width is None else _LayeredWorkers(width, costing)
        state = _Search(costing, workers=workers, confirms=2)  # type: ignore[arg-type]
        state.run_phased([])
        made_by_search = len(costing.wholes)
        state.confirm(2)
        results.append((state, costing, len(costing.wholes) - made_by_search))
    (alone, alone_costing, _), (two, two_costing, after) = results
    assert [(p.candidate, p.samples_per_second) for p in rank(two.plans)] == [
        (p.candidate, p.samples_per_second) for p in rank(alone.plans)
    ]
    assert two_costing.wholes[0] == _candidate(1)  # compiled beside candidate 3
    assert after == (0 if whole_rate > 8.0 else 1)
    assert len(alone_costing.wholes) == (1 if whole_rate > 8.0 else 2)


def test_nothing_is_compiled_whole_ahead_when_nothing_is_confirmed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shallow = {_candidate(1): 10.0, _candidate(2): 8.0, _candidate(3): 5.0}
    monkeypatch.setattr(_Search, "bounded", lambda self, needs: [(100.0, c) for c in shallow])
    costing = _Layered(shallow, dict(shallow))
    state = _Search(costing, workers=_LayeredWorkers(2, costing))  # type: ignore[arg-type]
    state.run_phased([])
    assert costing.wholes == [] and state.ahead == {}

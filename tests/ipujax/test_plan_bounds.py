"""What the plan search skips and reuses for a pipeline cannot change what it reports.

A pipeline whose stash alone is over a tile's memory is not built: its floor
(`partitioner.pipeline_peak_floor`) is at most the fullest tile its build reports, so it would
not have fit. A mesh's stashing and recomputing builds share its staged program (partitioned,
scheduled, split into stages) inside `partitioner.reusing`, keyed by every input that makes it,
and build exactly as they build apart; the stages' memory is swept before `fit_stages`, which
re-plans nothing when every stage fits. The search ranks the same plans, with the same figures,
as the search that traces and builds everything afresh, less the pipelines the stash rules out.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
import pytest
from helpers import layered_step, spec
from jax.sharding import PartitionSpec as P

import ipujax
import partitioner
from ipujax.planning import search, workload_model
from ipujax.planning.traces import Traces, pipelined_build
from partitioner.passes import staged_program
from partitioner.pipelines.stage_fit import fitted_stages, stage_memories
from partitioner.pipelines.stage_memory import fit_stages, stash_per_tile
from partitioner.reuse import kept

# 16 tiles of 30,000 B: a 64-wide layer's activations for 128 samples are 32 KiB, so stashing
# three micro-batches' of them is over a tile on the first of four stages, and not on the first
# of two; recomputing stashes less.
TARGET = dataclasses.replace(ipujax.Target.bow().with_tiles(16), bytes_per_tile=30_000)
MICROBATCHES = 4
WIDTH, BATCH, LAYERS = 64, 512, 8


def _piped(mesh: Any = None, layers: int = LAYERS, microbatches: int = MICROBATCHES) -> tuple:
    """An embedding, `layers` dense layers and a head, each under its own named scope, shapes
    only: the batch over dp, pipelined over pp; a mesh with any other axis is refused."""
    sizes = {} if mesh is None else mesh.shape
    if set(sizes) - {"dp", "pp"}:
        raise ValueError(f"this workload knows dp and pp, not {sorted(sizes)}")
    params = {
        "embed": spec((8, WIDTH)),
        "layers": [spec((WIDTH, WIDTH)) for _ in range(layers)],
        "head": spec((WIDTH, 4)),
    }
    dp = "dp" if sizes.get("dp", 1) > 1 else None
    kwargs: dict[str, Any] = {"in_shardings": (jax.tree.map(lambda _: P(), params), P(dp))}
    if "pp" in sizes:
        kwargs["pipeline"] = ipujax.Pipeline("pp", "auto", microbatches)
    return layered_step(), (params, spec((BATCH, 8))), kwargs


def _model() -> Any:
    return workload_model(_piped, lambda mesh, **extra: _piped(mesh=mesh, **extra))


def _mesh(**axes: int) -> ipujax.Mesh:
    return ipujax.make_mesh(tuple(axes.values()), tuple(axes), target=TARGET)


def _lowered(
    mesh: ipujax.Mesh, recompute: bool, traces: Traces | None = None, made: tuple | None = None
) -> Any:
    """The pipelined step lowered on `mesh` (through `traces` when given, as the search lowers
    it), from the workload `made` for the mesh (made anew when not given)."""
    fun, args, kwargs = made if made is not None else _piped(mesh)
    pipeline = dataclasses.replace(kwargs["pipeline"], recompute=recompute)
    kwargs = {**kwargs, "mesh": mesh, "pipeline": pipeline}
    if traces is None:
        return ipujax.jit(fun, **kwargs).lower(*args)
    return traces.lower(fun, args, kwargs)


def _fields(program: partitioner.Program) -> tuple:
    """A program's fields and its tasks', to compare by value (both compare by identity;
    a task's kernel is left out: a re-planned matmul's is made anew)."""
    tasks = tuple(
        tuple(getattr(t, f.name) for f in dataclasses.fields(t) if f.name not in ("kernel",))
        for t in program.tasks
    )
    kept = (f.name for f in dataclasses.fields(program) if f.name != "tasks")
    return (*(getattr(program, name) for name in kept), tasks)


def _figures(report: ipujax.CostReport) -> tuple:
    return report.seconds, report.peak_tile_bytes, report.time_split(), report.fits


@pytest.fixture(scope="module")
def searches() -> tuple[ipujax.planning.Plans, ipujax.planning.Plans]:
    quick = search(_model(), "bow", target=TARGET, confirm=1)
    whole = search(_model(), "bow", target=TARGET, confirm=1, reuse=False, stash_bound=False)
    return quick, whole


def test_the_search_reports_what_the_whole_search_reports(searches: Any) -> None:
    """Every plan the search reports has the whole search's figures, in the whole search's
    order, and the best is the same; what it does not report, the stash ruled out, and the
    whole search found it does not fit."""
    quick, whole = searches
    by_candidate = {p.candidate: p for p in whole.plans}
    assert [p.to_dict() for p in quick.plans] == [
        by_candidate[p.candidate].to_dict() for p in quick.plans
    ]
    reported = {p.candidate for p in quick.plans}
    order = [p.candidate for p in whole.plans]
    assert [p.candidate for p in quick.plans] == [c for c in order if c in reported]
    assert quick.best.to_dict() == whole.best.to_dict()

    ruled_out = [p for p in whole.plans if p.candidate not in reported]
    skipped = {s.candidate: s for s in quick.skipped}
    assert ruled_out, "the stash rules out no plan: the test no longer exercises the bound"
    for plan in ruled_out:
        assert plan.pipeline is not None and not plan.pipeline.recompute and not plan.fits
        why = skipped[plan.candidate]
        assert why.reason == "memory bound" and "stashes" in why.detail
    # every other reason the whole search gave, the search gives
    assert set(whole.skipped) <= set(quick.skipped)
    assert quick.compiles == whole.compiles - len(ruled_out)


def test_a_stash_over_the_tile_is_the_first_stage_of_four(searches: Any) -> None:
    """pp=4: stage 0 holds min(4, 2 x 3 + 1) = 4 micro-batches at once, so stashes for 3 more;
    dp=2 x pp=2: min(4, 3) = 3, for 2 more (`stage_memory.in_flight`), of a micro-batch half
    the size. Only the first is over 30,000 B on a tile by its stash alone."""
    quick, _ = searches
    ruled = {s.candidate.describe(): s.detail for s in quick.skipped if "stashes" in s.detail}
    assert list(ruled) == ["pp=4, no recompute"]
    assert ruled["pp=4, no recompute"].startswith("stage 0 stashes")
    assert ruled["pp=4, no recompute"].endswith("over the tile's 30,000 B")


@pytest.mark.parametrize(
    ("axes", "recompute"),
    [({"pp": 4}, False), ({"pp": 4}, True), ({"dp": 2, "pp": 2}, False), ({"pp": 2}, True)],
)
def test_the_floor_is_at_most_the_built_peak(axes: dict[str, int], recompute: bool) -> None:
    """The floor is a stage's stash on one tile, which its memory holds besides all else;
    `fit_stages` re-plans matmuls but leaves the values and layouts the stash reads."""
    mesh = _mesh(**axes)
    lowered = _lowered(mesh, recompute)
    args = pipelined_build(lowered)
    with partitioner.reusing() as held:
        floor = partitioner.pipeline_peak_floor(*args)
        built = lowered.compile(check_memory_fits=False)
        staged = staged_program(*args)
    # the compile built from the staged program the floor read: `pipelined_build` hands the
    # partitioner what `compile` does
    assert held.made == 1 and held.reused == 2
    report = built.cost_report()
    assert 0 < floor.bytes <= report.peak_tile_bytes
    pipe = args[4].pipeline
    assert pipe is not None
    for s in range(staged.split.stages):
        after = stash_per_tile(built.program, staged.split, s, pipe, TARGET)
        before = stash_per_tile(staged.program, staged.split, s, pipe, TARGET)
        np.testing.assert_array_equal(after, before)
        assert after.max() <= floor.bytes
    assert floor.bytes == max(
        stash_per_tile(staged.program, staged.split, s, pipe, TARGET).max()
        for s in range(staged.split.stages)
    )


def test_variants_share_the_staged_program_and_build_as_apart() -> None:
    """Stashing and recomputing on dp=2 x pp=2: one staged program for both, and the figures
    (time, peak, its split, each stage's memory) of two compiles traced and built apart."""
    mesh = _mesh(dp=2, pp=2)
    apart = []
    for recompute in (False, True):
        built = _lowered(mesh, recompute).compile(check_memory_fits=False)
        apart.append((_figures(built.cost_report()), built.built.stage_memories))
    traces, made = Traces(), _piped(mesh)  # the search makes a mesh's workload once
    with partitioner.reusing() as held:
        shared = []
        for recompute in (False, True):
            built = _lowered(mesh, recompute, traces, made).compile(check_memory_fits=False)
            shared.append((_figures(built.cost_report()), built.built.stage_memories))
    assert held.made == 1 and held.reused == 1
    for (figures, memories), (expected, expected_memories) in zip(shared, apart, strict=True):
        assert figures == expected
        for ours, theirs in zip(memories, expected_memories, strict=True):
            np.testing.assert_array_equal(ours.total, theirs.total)


def test_a_staged_program_is_kept_for_its_own_inputs_only() -> None:
    """Another mesh, another trace of equal shapes, or stages named in a list (which cannot be
    a key) are built afresh; the micro-batches, recomputation and memory check are read only
    after the stage split, so they share it; outside a block nothing is kept."""
    mesh = _mesh(dp=2, pp=2)
    graph, on, in_specs, out_specs, how = pipelined_build(_lowered(mesh, False))
    again, *_ = pipelined_build(_lowered(mesh, False))  # traced anew: equal, not the same
    pipe = how.pipeline
    assert pipe is not None
    alike = [
        dataclasses.replace(how, pipeline=dataclasses.replace(pipe, recompute=True)),
        dataclasses.replace(how, pipeline=dataclasses.replace(pipe, microbatches=8)),
        dataclasses.replace(how, check_memory=True),
    ]
    halves = [["embed", *(f"layer{i}" for i in range(4))], [f"layer{i}" for i in range(4, 8)]]
    named = dataclasses.replace(how, pipeline=dataclasses.replace(pipe, stages=halves))
    roomier = dataclasses.replace(TARGET, bytes_per_tile=40_000)
    other = ipujax.make_mesh((2, 2), ("dp", "pp"), target=roomier)
    with partitioner.reusing(capacity=8) as held:
        staged = staged_program(graph, on, in_specs, out_specs, how)
        for options in alike:
            assert staged_program(graph, on, in_specs, out_specs, options) is staged
        assert (held.made, held.reused) == (1, 3)
        assert staged_program(again, on, in_specs, out_specs, how) is not staged
        assert staged_program(graph, other, in_specs, out_specs, how) is not staged
        first = staged_program(graph, on, in_specs, out_specs, named)
        assert staged_program(graph, on, in_specs, out_specs, named) is not first
        assert (held.made, held.reused) == (3, 3)
    assert staged_program(graph, on, in_specs, out_specs, how) is not staged


def test_kept_holds_what_its_key_names_by_identity() -> None:
    """Outside a block nothing is kept; inside, a key is reused, an unhashable one is not kept,
    and the oldest entry goes beyond the capacity, with what it held."""
    made: list[int] = []

    def make() -> int:
        made.append(1)
        return len(made)

    assert kept("k", (), make) == 1 and kept("k", (), make) == 2
    with partitioner.reusing(capacity=1) as held:
        assert kept("k", (), make) == 3 and kept("k", (), make) == 3
        assert kept(["unhashable"], (), make) == 4 and kept(["unhashable"], (), make) == 5
        box = object()
        key = ("box", id(box))
        assert kept(key, (box,), make) == 6
        assert list(held.entries) == [key]
        assert held.entries[key] == (6, (box,))  # the result, and the box held with it
        assert kept("k", (), make) == 7  # evicted by the box
    assert (held.made, held.reused) == (3, 1)


@pytest.mark.parametrize(
    ("axes", "bytes_per_tile"),
    [
        ({"pp": 4}, 30_000),  # stage 0's stash alone is over: to `fit_stages` unswept
        ({"dp": 2, "pp": 2}, 30_000),  # swept, over, then to `fit_stages`
        ({"pp": 4}, 10_000_000),  # swept, and every stage fits
    ],
)
def test_fitted_stages_are_fit_stages_then_each_stages_memory(
    axes: dict[str, int], bytes_per_tile: int
) -> None:
    """Sweeping the stages first changes nothing: over budget `fit_stages` re-plans as it did,
    and within it the program stands, as `fit_stages` would have left it."""
    target = dataclasses.replace(TARGET, bytes_per_tile=bytes_per_tile)
    mesh = ipujax.make_mesh(tuple(axes.values()), tuple(axes), target=target)
    graph, on, in_specs, out_specs, how = pipelined_build(_lowered(mesh, False))
    staged = staged_program(graph, on, in_specs, out_specs, how)
    pipe = how.pipeline
    assert pipe is not None
    program, stages, memories = fitted_stages(staged.program, staged.split, pipe, target)
    expected = fit_stages(staged.program, staged.split, pipe, target)
    expected_stages, expected_memories = stage_memories(expected, staged.split, pipe, target)
    assert _fields(program) == _fields(expected)
    assert [_fields(p) for p in stages] == [_fields(p) for p in expected_stages]
    for ours, theirs in zip(memories, expected_memories, strict=True):
        np.testing.assert_array_equal(ours.total, theirs.total)
        np.testing.assert_array_equal(ours.always_live, theirs.always_live)
    fits = all(m.total.max() <= bytes_per_tile for m in memories)
    assert fits == (bytes_per_tile > 30_000)
    if fits:
        assert program is staged.program and expected is staged.program
    else:
        assert expected is not staged.program  # matmuls re-planned: the test exercises it

"""What the plan search reuses cannot change what it finds: its traces (a mesh's variants share
one, a pipeline is traced at its micro-batch alone) give the reports `ipujax.jit` gives and the
same ranking, and a pipelined mesh's memory bound is read from the shallow copies of a layered
workload, without making it whole."""

from __future__ import annotations

from typing import Any

import jax
import pytest
from helpers import layered_step, spec
from jax.sharding import PartitionSpec as P

import ipujax
import lowering
from ipujax.planning import search, workload_model
from ipujax.planning.traces import Traces

MICROBATCHES = 4


def _piped(mesh: Any = None, layers: int = 8, width: int = 32, batch: int = 16) -> tuple:
    """An embedding, `layers` dense layers and a head, each under its own named scope (the
    stages a pipeline cuts), shapes only: the batch over dp, pipelined over pp in
    `MICROBATCHES` micro-batches; a mesh with any other axis is refused."""
    sizes = {} if mesh is None else mesh.shape
    if set(sizes) - {"dp", "pp"}:
        raise ValueError(f"this workload knows dp and pp, not {sorted(sizes)}")

    step = layered_step()

    params = {
        "embed": spec((8, width)),
        "layers": [spec((width, width)) for _ in range(layers)],
        "head": spec((width, 4)),
    }
    dp = "dp" if sizes.get("dp", 1) > 1 else None
    kwargs: dict[str, Any] = {"in_shardings": (jax.tree.map(lambda _: P(), params), P(dp))}
    if "pp" in sizes:
        kwargs["pipeline"] = ipujax.Pipeline("pp", "auto", MICROBATCHES)
    return step, (params, spec((batch, 8))), kwargs


def _model(factory: Any = _piped, calls: list[int | None] | None = None) -> Any:
    def call(mesh: Any, **extra: Any) -> tuple:
        if calls is not None:
            calls.append(extra.get("layers"))
        return factory(mesh=mesh, **extra)

    return workload_model(factory, call)


def test_the_search_with_and_without_reuse_ranks_alike() -> None:
    """Plain plans at 2 and 4 layers, phased ones dominated, pipelines costed whole: every
    figure and reason the same whether traces are reused or each compile traces afresh."""
    reused = search(_model(), "bow", confirm=1)
    fresh = search(_model(), "bow", confirm=1, reuse=False)
    assert reused.to_dict() == fresh.to_dict()
    costed = [p.mesh for p in reused.plans]
    assert {"dp": 4} in costed and {"dp": 2, "pp": 2} in costed and {"pp": 4} in costed
    assert reused.compiles == fresh.compiles


def _costs(lowered: Any) -> tuple:
    report = lowered.compile(check_memory_fits=False).cost_report()
    return report.seconds, report.peak_tile_bytes, report.time_split(), report.fits


def _count_traces(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every trace ipujax makes goes through `lowering.lower` (ipujax.tracing's)."""
    counted: list[int] = []

    def lower(*args: Any, **kwargs: Any) -> Any:
        counted.append(1)
        return lowering.lower(*args, **kwargs)

    monkeypatch.setattr("ipujax.tracing.lower", lower)
    return counted


@pytest.mark.parametrize(
    ("axes", "variants"),
    [
        ((("dp", 4),), ({}, {"phases": "auto"})),
        ((("dp", 2), ("pp", 2)), ({"recompute": False}, {"recompute": True})),
    ],
)
def test_variants_share_one_trace_and_cost_as_jit_costs_them(
    axes: tuple, variants: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    names, sizes = zip(*axes, strict=True)
    mesh = ipujax.make_mesh(sizes, names)
    fun, args, kwargs = _piped(mesh)
    each = []
    for variant in variants:
        pipeline = kwargs.get("pipeline")
        if "recompute" in variant:
            pipeline = ipujax.Pipeline("pp", "auto", MICROBATCHES, variant["recompute"])
        phases = variant.get("phases")
        each.append({**kwargs, "mesh": mesh, "pipeline": pipeline, "phases": phases})
    counted = _count_traces(monkeypatch)
    expected = [_costs(ipujax.jit(fun, **k).lower(*args)) for k in each]
    # ipujax.jit traces a pipelined step twice (the whole batch and a micro-batch), else once
    assert len(counted) == len(each) * (2 if "pipeline" in kwargs else 1)
    counted.clear()
    traces = Traces()
    assert [_costs(traces.lower(fun, args, k)) for k in each] == expected
    assert traces.made == 1 and len(counted) == 1  # one trace (the micro-batch, pipelined)


def test_a_new_argument_of_the_same_shapes_shares_the_trace() -> None:
    """A workload made again for another mesh (a new step, new arguments of the same shapes)
    shares the trace when its step is alike and its program reads no mesh axis
    (`test_plan_alike.py`); each mesh's variants share it too."""
    traces = Traces()
    for dp in (4, 4, 2):
        mesh = ipujax.make_mesh((dp,), ("dp",))
        fun, args, kwargs = _piped(mesh)
        traces.lower(fun, args, {**kwargs, "mesh": mesh})
        traces.lower(fun, args, {**kwargs, "mesh": mesh, "phases": "auto"})
    assert traces.made == 1


def _huge(mesh: Any = None, layers: int = 16) -> tuple:
    return _piped(mesh, layers, width=16384)


def test_a_pipeline_bound_from_the_shallow_copies() -> None:
    """Layers of 16,384 x 16,384 float32, 1,073,741,824 B each, over the Bow's 941 MB chip
    alone: no plan can fit, phased or pipelined, and none is made whole to say so."""
    calls: list[int | None] = []
    plans = search(_model(_huge, calls), "bow", layouts=(("dp",), ("dp", "pp")), confirm=0)
    assert plans.plans == () and plans.compiles == 0
    assert None not in calls and set(calls) == {2, 4}
    reasons = {(tuple(s.candidate.axes), s.candidate.phases): s for s in plans.skipped}
    assert {s.reason for s in reasons.values()} == {"memory bound"}
    # pp=4 at full depth: 16 layers x 1,073,741,824 B + embed 8 x 16,384 x 4 = 524,288 B + head
    # 16,384 x 4 x 4 = 262,144 B + the batch 16 x 8 x 4 = 512 B = 17,180,656,128 B, over 4
    # stages: 4,295,164,032 B per IPU, extrapolated exactly from the 2- and 4-layer copies
    assert "4,295 MB per IPU" in reasons[((("pp", 4),), None)].detail
    # dp=4, phased: its largest input, one layer, is over the chip by itself
    assert "largest input is 1,074 MB" in reasons[((("dp", 4),), "auto")].detail

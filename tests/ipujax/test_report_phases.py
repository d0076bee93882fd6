"""The report of a phased program on several IPUs: the step's time split, FLOPs per IPU and for
the system, and the phase timeline in the HTML page and the Perfetto trace."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import ipujax
from ipujax.views.html import render_html
from ipujax.views.trace import build_trace

NAMES = ["layer0", "layer1"]


def step(ws, x):
    def loss(ws):
        h = x
        for name, w in zip(NAMES, ws, strict=True):
            with jax.named_scope(name):
                h = jnp.tanh(h @ w)
        return (h**2).mean()

    value, grads = jax.value_and_grad(loss)(ws)
    return [w - 0.1 * g for w, g in zip(ws, grads, strict=True)], value


@pytest.fixture(scope="module")
def report() -> ipujax.CostReport:
    target = dataclasses.replace(ipujax.Target.bow().with_tiles(16), io_tiles=2)
    mesh = ipujax.make_mesh((2,), ("replica",), target=target)
    ws = [jax.ShapeDtypeStruct((256, 256), jnp.float32) for _ in NAMES]
    x = jax.ShapeDtypeStruct((8, 256), jnp.float32)
    jitted = ipujax.jit(step, mesh=mesh, in_shardings=(P(), P("replica")), phases=NAMES)
    return jitted.lower(ws, x).compile().cost_report()


def test_the_time_split_adds_up_to_the_step(report: ipujax.CostReport) -> None:
    split = report.time_split()
    assert set(split) == {
        "compute", "copies", "exchange", "sync", "collectives", "streaming", "host",
    }  # fmt: skip
    assert sum(split.values()) == pytest.approx(report.seconds)
    # On-tile copies (layout changes: transposes, rearrangements, slices) are the compute
    # cycles of the copy supersteps; compute is everyone else's.
    copies = sum(s.compute_cycles for s in report.supersteps if s.kind == "copy")
    others = sum(s.compute_cycles for s in report.supersteps if s.kind != "copy")
    assert split["copies"] == pytest.approx(copies / report.clock_hz)
    assert split["compute"] == pytest.approx(others / report.clock_hz)
    assert copies > 0  # the weight gradient's operands are transposed for the AMP, at least
    exposed = sum(p.stream_cycles - p.overlapped_cycles for p in report.phases)
    assert split["streaming"] == pytest.approx(exposed / report.clock_hz)
    assert split["collectives"] > 0  # the gradients' reduce-scatter, at least


def test_flops_are_per_ipu_and_utilisation_is_the_systems(report: ipujax.CostReport) -> None:
    assert report.system_flops == 2 * report.flops
    peak_per_ipu = report.peak_flops_per_cycle * report.tiles_per_ipu * report.total_cycles
    assert report.flop_utilisation == pytest.approx(report.flops / peak_per_ipu)
    assert f"system {report.system_flops:,}" in report.summary()


def test_the_html_page_draws_the_phase_timeline(report: ipujax.CostReport) -> None:
    page = render_html(report)
    assert 'aria-label="phase timeline"' in page
    for phase in report.phases:
        assert f"{phase.name}: compute {phase.compute_cycles:,} cycles" in page
    assert "layer1 (backward)" in page


def test_the_trace_puts_each_io_window_where_it_runs(report: ipujax.CostReport) -> None:
    trace = json.loads(json.dumps(build_trace(report)))
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in trace["traceEvents"]
        if e.get("name") == "thread_name"
    }
    phases, windows = {}, {}
    for e in trace["traceEvents"]:
        if e.get("ph") != "X" or e["pid"] != 0:
            continue
        if e["name"].startswith("StreamCopy: phase "):
            phases[e["args"]["phase"]] = e
        elif e["name"].startswith("StreamCopy: IO for "):
            windows[e["args"]["phase"]] = e
            assert threads[0, e["tid"]] == "IO path (StreamCopy)"
    assert len(phases) == len(report.phases) == len(windows)
    us = 1e6 / report.clock_hz
    for index, phase in enumerate(report.phases):
        assert windows[index]["ts"] == pytest.approx(
            phases[index]["ts"] - phase.overlapped_cycles * us, abs=1e-3
        )
        assert windows[index]["dur"] == pytest.approx(phase.stream_cycles * us, abs=1e-3)
    assert any(p.overlapped_cycles for p in report.phases)  # the IO tiles hide something
    host = report.time_split()["host"]
    total = sum(e["dur"] for e in phases.values())
    assert np.isclose(total, (report.seconds - host) * 1e6, rtol=1e-6)

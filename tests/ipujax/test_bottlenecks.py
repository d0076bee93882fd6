"""What bounds each superstep, by hand and as a property; the bounds in the JSON and the
execution tables; and the HTML report's roofline of the compute sets against the Bow's roofs."""

from __future__ import annotations

import json
import re
import warnings

import jax
import jax.numpy as jnp
from helpers import target
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

import ipujax
from ipujax import bottlenecks as b
from ipujax.views.html import render_html
from ipujax.views.html.roofline import compute_sets, roofs
from ipujax.views.tables.execution import execution_tables
from partitioner import Superstep


def _step(kind: str = "compute", name: str = "s", **cycles: int) -> Superstep:
    figures = dict(compute_cycles=0, exchange_cycles=0, sync_cycles=0, link_cycles=0)
    return Superstep(name, "op", "f.py:1", 1, 0, 0, **{**figures, **cycles}, kind=kind)


def test_each_superstep_is_bound_by_its_longest_part() -> None:
    # The probe's matmul: 769 compute, 693 exchange, 90 sync cycles: compute bound.
    assert b.bound(_step(compute_cycles=769, exchange_cycles=693, sync_cycles=90)) == "compute"
    # Its weight gradient's reduction of partials: 405 compute, 484 exchange: exchange bound.
    assert b.bound(_step(compute_cycles=405, exchange_cycles=484, sync_cycles=90)) == "exchange"
    # An all-reduce's ring: 24,793 link cycles over 221 compute, 132 exchange, 111 sync.
    parts = dict(compute_cycles=221, exchange_cycles=132, sync_cycles=111)
    assert b.bound(_step("collective", **parts, link_cycles=24_793)) == "links"
    assert b.bound(_step("collective", **parts)) == "compute"  # its on-chip share alone
    assert b.bound(_step("pipeline", link_cycles=10, compute_cycles=9)) == "links"  # sends
    assert b.bound(_step("stream", link_cycles=5, sync_cycles=4)) == "streaming"
    assert b.bound(_step("host", link_cycles=205_190)) == "host"
    assert b.bound(_step(sync_cycles=90)) == "sync"
    assert b.bound(_step()) == b.IDLE
    # A tie goes to the first of compute, exchange, sync, links.
    assert b.bound(_step(compute_cycles=5, exchange_cycles=5)) == "compute"


def test_the_totals_by_hand() -> None:
    steps = [
        _step(name="a", compute_cycles=100),
        _step(name="b", compute_cycles=300, exchange_cycles=20),
        _step(name="c", exchange_cycles=250),
        _step("host", name="in", link_cycles=50),
        _step(name="idle"),
    ]
    # Compute bounds a (100) and b (320): 420 cycles, b the costliest; exchange c, 250;
    # host 50; the idle step bounds nothing.
    assert b.bound_totals(steps) == [
        b.BoundTotal("compute", 2, 420, "b"),
        b.BoundTotal("exchange", 1, 250, "c"),
        b.BoundTotal("host", 1, 50, "in"),
    ]


_cycles = st.integers(0, 10**7)


@given(st.sampled_from(("compute", "copy", "collective", "stream", "host", "pipeline")),
       _cycles, _cycles, _cycles, _cycles)  # fmt: skip
def test_the_bound_is_a_longest_part(kind, c, x, s, link) -> None:
    step = _step(kind, compute_cycles=c, exchange_cycles=x, sync_cycles=s, link_cycles=link)
    found = b.bound(step)
    part = {
        "compute": c, "exchange": x, "sync": s, "links": link, "streaming": link,
        "host": step.cycles,
    }  # fmt: skip
    if step.cycles == 0:
        assert found == b.IDLE
    else:
        assert part[found] == (step.cycles if kind == "host" else max(c, x, s, link))


def _report() -> ipujax.CostReport:
    def layer(w, x):
        return jnp.tanh(x @ w) * 2.0

    w = jax.ShapeDtypeStruct((256, 256), jnp.float16)
    x = jax.ShapeDtypeStruct((512, 256), jnp.float16)
    mesh = ipujax.make_mesh((1,), ("ipu",), target=target(64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ipujax.jit(layer, mesh=mesh).lower(w, x).compile().cost_report()


def test_the_bounds_are_in_the_json_and_the_execution_tables() -> None:
    report = _report()
    data = json.loads(report.to_json())
    assert data["bounds"] == [b.bound(s) for s in report.supersteps]
    assert "host" in data["bounds"] and "compute" in data["bounds"]
    console = Console(width=200, record=True)
    for table in execution_tables(report):
        console.print(table)
    text = console.export_text()
    assert "bounds (steps, share)" in text  # a column of the cycles by kind
    # The two host transfers (inputs, outputs) are bound by the host.
    assert re.search(r"host\s+StreamCopy \(host\).*\s2 \(\d+\.\d%\)", text), text


def test_the_roofline_of_the_compute_sets() -> None:
    report = _report()
    # A Bow tile's AMP does 128 fp16 FLOPs a cycle and its exchange 4 bytes: on 64 tiles at
    # 1.85 GHz, 128 x 64 x 1.85e9 = 15.155 TFLOP/s and 4 x 64 x 1.85e9 = 473.6 GB/s, so the
    # ridge is at 128 / 4 = 32 FLOPs per byte.
    r = roofs(report)
    assert r.peak == 128 * 64 * 1.85e9 and r.exchange == 4 * 64 * 1.85e9 and r.ridge == 32
    sets = compute_sets(report)
    assert sets[0].name == "dot_general.matmul"  # the costliest: 2 x 512 x 256 x 256 FLOPs
    assert sum(c.flops for c in sets) == sum(s.flops for s in report.supersteps)
    html = render_html(report)
    svg = html.split('aria-label="roofline of the compute sets"', 1)[1].split("</svg>", 1)[0]
    assert svg.count("<circle") == len(sets)
    assert "peak 15.2 TFLOP/s" in svg and "What bounds the supersteps" in html
    assert "host: inputs" in html.split("What bounds the supersteps", 1)[1]
    assert "http://" not in svg and "https://" not in svg  # drawn inline, nothing fetched

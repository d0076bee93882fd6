"""The views on small hand-made reports: the figures they share (tile balance, groups by op,
histogram, deltas) and what each view shows for collectives, phases and several IPUs."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from rich.console import Console

from ipujax.report import CollectiveCost, CostReport, PhaseCost, SuperstepCost, TileUsage
from ipujax.views import metrics as m
from ipujax.views.diff import diff_renderables
from ipujax.views.html import render_html
from ipujax.views.tables import report_renderables


def _step(op: str, source: str, tiles: int, compute: int, exchange: int, group: str = "ipu0"):
    return SuperstepCost(
        op, op, source, tiles, 10 * tiles, 8 * exchange, compute, exchange, 90, group
    )


def small_report(**changes) -> CostReport:
    """Four tiles per IPU; two adds on one line, a dot on another."""
    fields = dict(
        target="bow",
        system="single IPU",
        ipus=1,
        tiles_per_ipu=4,
        clock_hz=1e9,
        bytes_per_tile=1000,
        total_cycles=0,
        flops=120,
        peak_flops_per_cycle=32,
        exchange_bytes=64,
        ipu_link_bytes=0,
        streaming_bytes=0,
        tile_memory=np.array([[400, 300, 200, 100]]),
        always_live=np.array([[50, 50, 0, 0]]),
        supersteps=(
            _step("add", "/x/model.py:3", 4, 100, 0),
            _step("add", "/x/model.py:3", 2, 100, 8),
            _step("dot_general", "/x/model.py:7", 1, 200, 0),
        ),
        top_tiles=(
            TileUsage(0, 0, 400, ((300, "w at /x/model.py:1"),)),
            TileUsage(0, 1, 300, ((300, "w at /x/model.py:1"),)),
        ),
    )
    fields.update(changes)
    fields["total_cycles"] = sum(s.cycles for s in fields["supersteps"])  # type: ignore[attr-defined]
    return CostReport(**fields)  # type: ignore[arg-type]


def _text(renderables) -> str:
    console = Console(width=140, record=True, file=io.StringIO())
    for r in renderables:
        console.print(r)
    return console.export_text()


def test_tile_balance_by_its_definition() -> None:
    report = small_report()
    # (100*4 + 100*2 + 200*1) / ((100 + 100 + 200) * 4)
    assert m.tile_balance(report) == pytest.approx(800 / 1600)
    assert "50.0%" in _text(report_renderables(report))


def test_groups_by_op_and_by_source_line() -> None:
    report = small_report()
    lines = m.by_op_and_source(report)
    assert [(c.op, c.source, c.steps, c.cycles) for c in lines] == [
        ("add", "/x/model.py:3", 2, 100 + 100 + 8 + 180),
        ("dot_general", "/x/model.py:7", 1, 290),
    ]
    kinds = m.kind_totals(report)
    assert (kinds.compute, kinds.exchange, kinds.sync, kinds.total) == (
        400,
        8,
        270,
        report.total_cycles,
    )


def test_histogram_and_labels() -> None:
    bins = m.histogram(np.array([100, 200, 300, 400]), bins=3)
    assert sum(b.count for b in bins) == 4
    assert bins[0].low == 100 and bins[-1].high == 400
    assert m.histogram(np.array([5, 5]), bins=10) == [m.Bin(5, 5, 2)]
    assert m.bin_labels([m.Bin(3_850_368, 3_850_368, 1), m.Bin(3_850_369, 3_850_369, 0)]) == [
        "3,850,368 B",
        "3,850,369 B",
    ]


def test_deltas_and_formats() -> None:
    assert m.fmt_delta(100, 150) == ("+50", "+50.00%")
    assert m.fmt_delta(0, 5) == ("+5", "new")
    assert m.fmt_delta(7, 7) == ("0", "0%")
    assert m.fmt_delta(2048, 1024, as_bytes=True) == ("-1,024 (-1.0 KiB)", "-50.00%")
    assert m.fmt_seconds(157.4e-6) == "157.4 µs"
    assert m.short_source("/usr/lib/python3/site-packages/optax/_src/a.py:3") == "optax/_src/a.py:3"


def test_tables_show_collectives_phases_and_over_budget() -> None:
    report = small_report(
        tile_memory=np.array([[1400, 300, 200, 100]]),
        collectives=(CollectiveCost("all_reduce", ("dp",), 2, 4096, 1200, "add", "", "grads"),),
        phases=(PhaseCost("fwd", 500, 2048, 900),),
    )
    text = _text(report_renderables(report))
    assert re.search(r"fits\s+NO", text)
    assert re.search(r"all_reduce\s+dp\s+2\s+4,096\s+1,200", text)
    assert re.search(r"fwd\s+500(\s+0){7}\s+900", text)  # phase, cycles, ..., peak bytes
    assert "(over)" in text
    assert "(the same largest tensors as tile 0)" in text


def test_html_draws_each_ipu() -> None:
    report = small_report(
        ipus=2,
        tile_memory=np.array([[400, 300, 200, 100], [10, 20, 30, 40]]),
        always_live=np.zeros((2, 4), int),
        supersteps=(
            _step("add", "/x/m.py:3", 4, 100, 0),
            _step("add", "/x/m.py:3", 4, 100, 0, "ipu1"),
        ),
    )
    page = render_html(report)
    assert "Memory per tile, IPU 0" in page and "Memory per tile, IPU 1" in page
    assert page.count("<title>IPU 1 tile") == 4


def test_diff_marks_ops_only_in_one_report() -> None:
    a = small_report()
    b = small_report(supersteps=(*a.supersteps, _step("tanh", "/x/model.py:9", 4, 50, 0)))
    text = _text(diff_renderables(a, b, "a.json", "b.json"))
    assert re.search(r"tanh\s+0\s+140\s+\+140\s+new", text)
    assert re.search(r"supersteps\s+3\s+4\s+\+1\s+\+33\.33%", text)


CATEGORIES = (
    ("variables_always_live", 50),
    ("variables_not_always_live", 250),
    ("vertex_code", 60),
    ("vertex_state", 10),
    ("exchange_code", 20),
    ("control_code", 8),
    ("stack", 2),
)  # tile 0: 400 B in all


def _with_categories() -> CostReport:
    top = TileUsage(0, 0, 400, ((300, "w at /x/model.py:1"),), CATEGORIES)
    ipu = tuple((name, 2 * size) for name, size in CATEGORIES)
    return small_report(top_tiles=(top,), memory_categories=ipu)


def test_memory_by_category_in_the_tables_html_and_diff() -> None:
    report = _with_categories()
    text = _text(report_renderables(report))
    assert "by category, as PopVision counts it (fullest tile 0" in text
    assert re.search(r"vertex_code\s+vertexCode\s+60 B\s+15\.0%\s+120 B", text)
    assert re.search(r"exchange_code\s+internalExchangeCode\s+20 B", text)
    assert re.search(r"total\s+400 B\s+800 B", text)
    page = render_html(report)
    assert "By category, as PopVision counts it" in page
    for name, _ in CATEGORIES:
        assert name in text and name in page
    assert "vertexInstanceState" in page and "controlCode" in page
    diff = _text(diff_renderables(small_report(), report, "old.json", "new.json"))
    assert re.search(r"vertex_code\s+0 B\s+60 B\s+\+60", diff)
    assert "by category" in report.summary()


def test_reports_without_categories_say_so() -> None:
    report = small_report()  # as read from a report older than version 3
    assert "not recorded (a report older than version 3)" in _text(report_renderables(report))
    assert "not recorded (a report older than version 3)" in render_html(report)
    assert "by category" not in report.summary()

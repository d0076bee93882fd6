"""The Chrome/Perfetto trace: valid "traceEvents" JSON, slices in PopVision's step kinds, no
overlaps on a thread, and the whole as long as the report's time per step."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import re
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from ipujax.report import CollectiveCost, CostReport, PhaseCost
from ipujax.views.html import render_html
from ipujax.views.tables import report_renderables
from ipujax.views.trace import build_trace

KINDS = {"Sync", "DoExchange", "OnTileExecute", "GlobalExchange", "StreamCopy"}


def check_chrome_trace(trace: Any) -> list[dict]:
    """Checks the trace-event format; returns the "X" slices."""
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    slices = []
    for event in trace["traceEvents"]:
        assert {"ph", "name", "pid", "tid"} <= set(event), event
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
        if event["ph"] == "X":
            assert isinstance(event["ts"], (int, float)) and event["ts"] >= 0
            assert isinstance(event["dur"], (int, float)) and event["dur"] >= 0
            slices.append(event)
        else:
            assert event["ph"] == "M", event
    by_thread = defaultdict(list)
    for event in slices:
        by_thread[event["pid"], event["tid"]].append(event)
    for events in by_thread.values():
        events.sort(key=lambda e: e["ts"])
        for before, after in itertools.pairwise(events):
            assert before["ts"] + before["dur"] <= after["ts"] + 1e-6, (before, after)
    return slices


def _span(slices: list[dict]) -> float:
    return max(e["ts"] + e["dur"] for e in slices) - min(e["ts"] for e in slices)


def test_trace_of_the_tiny_gpt(gpt_files) -> None:
    report = CostReport.from_json(gpt_files.json.read_text())
    trace = json.loads(gpt_files.trace.read_text())
    slices = check_chrome_trace(trace)
    assert abs(_span(slices) - report.seconds * 1e6) <= 1e-3
    assert {e["cat"] for e in slices} == {"Sync", "DoExchange", "OnTileExecute", "StreamCopy"}
    assert all(e["name"].startswith(e["cat"] + ": ") for e in slices)
    hosts = [e for e in slices if e["cat"] == "StreamCopy"]  # the host transfers
    assert [e["args"]["step_name"] for e in hosts] == ["host: inputs", "host: outputs"]
    computes = [e for e in slices if e["cat"] == "OnTileExecute"]
    assert len(computes) == sum(1 for s in report.supersteps if s.compute_cycles > 0)
    assert sum(e["args"]["cycles"] for e in slices) == report.total_cycles
    first = report.supersteps[1]  # after the host transfer
    assert computes[0]["args"]["tiles"] == first.tiles and computes[0]["args"]["op"] == first.op
    names = {
        (e["name"], e["args"]["name"])
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] in ("process_name", "thread_name")
    }
    assert ("process_name", "IPU 0 (bow)") in names
    groups = {s.sync_group for s in report.supersteps}
    assert {("thread_name", f"sync group {g}") for g in groups} <= names


def test_each_superstep_is_sync_exchange_compute_in_order(gpt_files) -> None:
    slices = check_chrome_trace(json.loads(gpt_files.trace.read_text()))
    report = CostReport.from_json(gpt_files.json.read_text())
    order = {"Sync": 0, "DoExchange": 1, "GlobalExchange": 2, "StreamCopy": 2, "OnTileExecute": 3}
    by_step = defaultdict(list)
    for e in sorted(slices, key=lambda e: e["ts"]):
        by_step[e["args"]["superstep"]].append(e)
    assert sorted(by_step) == list(range(len(report.supersteps)))
    for index, events in by_step.items():
        kinds = [order[e["cat"]] for e in events]
        assert kinds == sorted(kinds)
        for before, after in itertools.pairwise(events):  # consecutive, no gaps
            assert abs(before["ts"] + before["dur"] - after["ts"]) < 1e-6
        assert sum(e["args"]["cycles"] for e in events) == report.supersteps[index].cycles


def _two_ipus_with_collectives_and_phases(report: CostReport) -> CostReport:
    """The report as if on two IPUs, its second superstep an all-reduce over the IPU-Links, one
    collective that no superstep carries, and two phases."""
    first, second = report.supersteps[:2]
    ring = dataclasses.replace(
        second, name="all_reduce(dp)", sync_group="dp", link_cycles=1200, kind="collective"
    )
    steps = (first, ring, *report.supersteps[2:])
    return dataclasses.replace(
        report,
        ipus=2,
        total_cycles=sum(s.cycles for s in steps),
        tile_memory=np.stack([report.tile_memory[0]] * 2),
        always_live=np.stack([report.always_live[0]] * 2),
        supersteps=steps,
        collectives=(
            CollectiveCost("all_reduce", ("dp",), 2, 4096, 1290, ring.name, ring.source, "grads"),
            CollectiveCost("all_gather", ("dp",), 2, 1024, 300, "nowhere", "", "no step"),
        ),
        phases=(PhaseCost("fwd", 500, 1 << 20, 1000), PhaseCost("bwd", 700, 1 << 21, 2000)),
    )


def test_collectives_and_phases_get_their_own_slices(gpt_files) -> None:
    report = _two_ipus_with_collectives_and_phases(CostReport.from_json(gpt_files.json.read_text()))
    trace = build_trace(report)
    slices = check_chrome_trace(json.loads(json.dumps(trace)))
    assert {e["cat"] for e in slices} == KINDS
    assert {e["pid"] for e in slices} == {0, 1}  # every IPU runs the same program
    for pid in (0, 1):
        phases = {e["tid"] for e in slices if e["name"].startswith("StreamCopy: phase ")}
        mine = [e for e in slices if e["pid"] == pid and e["tid"] not in phases]
        assert sum(e["args"]["cycles"] for e in mine) == report.total_cycles + 300
    links = [e for e in slices if e["cat"] == "GlobalExchange" and e["pid"] == 0]
    ring, extra = sorted(links, key=lambda e: e["ts"])
    assert ring["args"]["superstep"] == 1 and ring["args"]["bytes_per_ipu"] == 4096
    assert ring["args"]["cycles"] == 1200 and ring["args"]["why"] == "grads"
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in trace["traceEvents"]
        if e["name"] == "thread_name"
    }
    assert threads[0, ring["tid"]] == "sync group dp"
    assert threads[0, extra["tid"]] == "IPU-Links (GlobalExchange)"  # no superstep carries it
    assert extra["ts"] == pytest.approx(report.seconds * 1e6)  # so it goes after the program
    streams = [e for e in slices if e["name"].startswith("StreamCopy: phase ")]
    assert sorted(e["args"]["streaming_bytes"] for e in streams) == [1 << 20] * 2 + [1 << 21] * 2
    processes = [e for e in trace["traceEvents"] if e["name"] == "process_name"]
    assert [e["args"]["name"] for e in processes] == ["IPU 0 (bow)", "IPU 1 (bow)"]


def test_views_of_several_ipus(gpt_files) -> None:
    report = _two_ipus_with_collectives_and_phases(CostReport.from_json(gpt_files.json.read_text()))
    page = render_html(report)
    assert "IPUs 0-1 (alike)" in page and "GlobalExchange" in page
    text = _text(report_renderables(report))
    assert re.search(r"IPU-Links\s+GlobalExchange\s+1,200", text)
    assert re.search(r"all_reduce\s+dp\s+2\s+4,096\s+1,290\s+all_reduce\(dp\)", text)
    assert re.search(r"^\s+0-1\s+\d+\s+", text, re.M)  # alike IPUs share one row
    assert re.search(r"fwd\s+500(\s+0){7}\s+1,000", text)


def _text(renderables) -> str:
    console = Console(width=160, record=True, file=io.StringIO())
    for r in renderables:
        console.print(r)
    return console.export_text()

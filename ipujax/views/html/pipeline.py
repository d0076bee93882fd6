"""The pipeline section: each stage's figures and the timeline of its micro-batches (a row per
stage, a box per forward or backward, then the update), as Graphcore's pipelining diagrams
draw them."""

from __future__ import annotations

import itertools

from ipujax.report import CostReport
from ipujax.views import metrics as m
from ipujax.views.html.widgets import WIDTH, legend, panel, segment, svg, table

FORWARD, BACKWARD, UPDATE = "#3b75af", "#ef8636", "#2a9d8f"
MAX_DRAWN = 96  # pipeline cycles drawn: the first and last halves of this many
COLUMNS = (
    "stage",
    "blocks",
    "forward",
    "backward",
    "of which recompute",
    "update",
    "sends B",
    "returns B",
    "in flight",
    "stash B",
    "peak tile B",
)


def _timeline(report: CostReport) -> str:
    blocks = m.pipeline_blocks(report, MAX_DRAWN)
    drawn = sorted({b.cycle for b in blocks})
    cut = next((i for i, (a, b) in enumerate(itertools.pairwise(drawn)) if b != a + 1), None)
    cycles = report.pipeline_cycles
    # Cycles left out are drawn as a gap a cycle wide.
    at, x = {}, 0.0
    for i, t in enumerate(drawn):
        at[t] = x
        x += cycles[t] + (cycles[t] if i == cut else 0)
    last = max((s.update_cycles for s in report.stages), default=0)
    total = (x + last) or 1
    label_w, lane_h = 70, 22
    scale = (WIDTH - label_w) / total
    body = []
    for s in report.stages:
        y = s.stage * lane_h
        body.append(
            f'<text x="{label_w - 6}" y="{y + lane_h / 2 + 4}" font-size="12" '
            f'text-anchor="end">stage {s.stage}</text>'
        )
    for b in blocks:
        colour = FORWARD if b.kind == "forward" else BACKWARD
        x0 = label_w + (at[b.cycle] + b.start - b.cycle_start) * scale
        tip = f"stage {b.stage}: {b.kind} of micro-batch {b.microbatch}, {b.cycles:,} cycles"
        body.append(
            segment(x0, b.stage * lane_h + 3, b.cycles * scale, lane_h - 6, colour, tip, True)
        )
    for s in report.stages:
        tip = f"stage {s.stage}: update, {s.update_cycles:,} cycles"
        x0 = label_w + x * scale
        body.append(
            segment(
                x0, s.stage * lane_h + 3, s.update_cycles * scale, lane_h - 6, UPDATE, tip, True
            )
        )
    height = lane_h * len(report.stages) + 4
    return legend([("forward", FORWARD), ("backward", BACKWARD), ("update", UPDATE)]) + svg(
        WIDTH, height, "pipeline timeline", "".join(body)
    )


def pipeline_section(report: CostReport) -> str:
    if not report.stages:
        return panel("Pipeline", '<p class="none">none (no pipeline)</p>')
    rows = [
        (
            str(s.stage),
            "+".join(s.blocks),
            *(
                f"{n:,}"
                for n in (
                    s.forward_cycles,
                    s.backward_cycles,
                    s.recompute_cycles,
                    s.update_cycles,
                    s.send_bytes,
                    s.return_bytes,
                    s.in_flight,
                    s.stash_bytes,
                    s.peak_tile_bytes,
                )
            ),
        )
        for s in report.stages
    ]
    listing = table(
        COLUMNS,
        rows,
        numeric=tuple(range(2, len(COLUMNS))),
        row_classes=[
            "over" if s.peak_tile_bytes > report.bytes_per_tile else "" for s in report.stages
        ],
    )
    cycles = len(report.pipeline_cycles)
    shown = (
        ""
        if cycles <= MAX_DRAWN
        else f" (the first and last {MAX_DRAWN // 2} of {cycles:,} cycles)"
    )
    note = (
        f"{len(report.stages)} stages, {report.microbatches:,} micro-batches, {cycles:,} pipeline "
        f"cycles{shown}; bubble {100 * report.bubble_fraction:.1f}% of the stages' pipeline time. "
        "Cycles per micro-batch; sends and returns are bytes per micro-batch to the next and "
        "previous stage."
    )
    return panel("Pipeline timeline", _timeline(report), note) + panel("Stages", listing)

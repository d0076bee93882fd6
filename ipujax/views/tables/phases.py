"""The tables of a step split over time: its phases (streaming against compute) and a pipelined
step's stages."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from ipujax.report import CostReport
from ipujax.views import metrics as m
from ipujax.views.tables.widgets import titled_table


def phases_tables(report: CostReport) -> list[RenderableType]:
    if not report.phases:
        return [Text.assemble(("Phases: ", "bold"), "none (phases=None)")]
    table = titled_table(
        "Phases (bytes per IPU; streaming hidden behind the previous phase with IO tiles)",
        *m.PHASE_COLUMNS,
        numeric=tuple(range(1, len(m.PHASE_COLUMNS))),
    )
    for p in report.phases:
        style = "bold red" if p.peak_tile_bytes > report.bytes_per_tile else ""
        *figures, peak = (m.fmt_int(n) for n in m.phase_figures(p))
        table.add_row(p.name, *figures, Text(peak, style=style))
    return [table]


def pipeline_tables(report: CostReport) -> list[RenderableType]:
    """A pipelined step's stages: cycles per micro-batch, update, sends, stash and memory."""
    if not report.stages:
        return []
    table = titled_table(
        f"Pipeline: {len(report.stages)} stages x {m.fmt_int(report.microbatches)} micro-batches"
        f", {m.fmt_int(len(report.pipeline_cycles))} pipeline cycles, bubble "
        f"{100 * report.bubble_fraction:.1f}% (cycles per micro-batch; bytes per micro-batch)",
        "stage",
        "blocks",
        "forward",
        "backward",
        "update",
        "sends",
        "returns",
        "in flight",
        "peak tile",
        numeric=(2, 3, 4, 5, 6, 7, 8),
    )
    for s in report.stages:
        style = "bold red" if s.peak_tile_bytes > report.bytes_per_tile else ""
        blocks = s.blocks[0] if len(s.blocks) == 1 else f"{s.blocks[0]} .. {s.blocks[-1]}"
        table.add_row(
            str(s.stage),
            blocks,
            m.fmt_int(s.forward_cycles),
            m.fmt_int(s.backward_cycles),
            m.fmt_int(s.update_cycles),
            m.fmt_int(s.send_bytes),
            m.fmt_int(s.return_bytes),
            m.fmt_int(s.in_flight),
            Text(m.fmt_int(s.peak_tile_bytes), style=style),
        )
    return [table]

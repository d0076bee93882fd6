"""What bounds the supersteps (`ipujax.bottlenecks`), as a column of the execution table of
cycles by kind: beside each kind of cycles, the supersteps whose longest part they are and
those supersteps' share of the step (a copy's compute counts as compute)."""

from __future__ import annotations

from ipujax.bottlenecks import bound_totals
from ipujax.report import CostReport
from ipujax.views import metrics as m

# A bound -> the row of `metrics.Kinds.rows()` it stands beside.
KIND_ROW = {
    "compute": "compute",
    "exchange": "exchange",
    "sync": "sync",
    "links": "IPU-Links",
    "streaming": "streaming",
    "host": "host",
}
HEADER = "bounds (steps, share)"


def bound_cells(report: CostReport) -> dict[str, str]:
    """Each kind row's cell: '2,497 (74.0%)'; rows that bound nothing are absent."""
    total = sum(s.cycles for s in report.supersteps) or 1
    return {
        KIND_ROW[b.bound]: f"{b.steps:,} ({m.fmt_pct(b.cycles / total, 1)})"
        for b in bound_totals(report.supersteps)
    }

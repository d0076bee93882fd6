"""How far to trust the step's time: its range (`CostReport.seconds_range`) and, per cost term,
its seconds, its error band and the fidelity rows behind it (`ipujax.bands`)."""

from __future__ import annotations

from ipujax import bands
from ipujax.bands import term_times
from ipujax.report import CostReport
from ipujax.terms import MEMORY
from ipujax.views import metrics as m
from ipujax.views.html.widgets import details, e, table


def range_note(report: CostReport) -> str:
    """'1.2 ms to 1.6 ms': the time per step's card note."""
    low, high = report.seconds_range
    return f"{m.fmt_seconds(low)} to {m.fmt_seconds(high)}"


def trust_panel(report: CostReport) -> str:
    """The range, then the terms' bands, folded away."""
    low, high = report.seconds_range
    times = term_times(report)
    total = sum(x.seconds for x in times) or 1
    rows = [
        (
            x.band.term,
            m.fmt_seconds(x.seconds),
            m.fmt_pct(x.seconds / total, 1),
            f"{x.band.low:.2f}-{x.band.high:.2f}x",
            x.band.evidence,
            "; ".join(x.band.rows) or "none",
        )
        for x in times
    ]
    listing = table(
        ("cost term", "time", "share", "band", "evidence", "fidelity rows"),
        rows,
        numeric=(1, 2, 3),
        prose=(5,),
    )
    intro = (
        f"<p>The step takes {e(m.fmt_seconds(report.seconds))}; by the errors the fidelity "
        f"rows measured for each cost term it uses, between {e(m.fmt_seconds(low))} and "
        f"{e(m.fmt_seconds(high))} (every term erring the same way; on several IPUs at least "
        "the whole systems' band). docs/fidelity.md lists the rows.</p>"
    )
    memory = bands.band(MEMORY)
    least, most = bands.memory_range(report.peak_tile_bytes)
    intro += (
        f"<p>The fullest tile holds {report.peak_tile_bytes:,} B; by the memory rows' errors "
        f"({memory.low:.2f}-{memory.high:.2f}x), between {least:,} and {most:,} B.</p>"
    )
    return intro + details("The time by cost term, with its band", listing)

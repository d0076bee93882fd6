"""The summary table: the target, the step's cycles and time, FLOPs and their utilisation, the
peak tile memory, whether every tile fits, and the caveats the figures rest on."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ipujax.report import CostReport
from ipujax.views import metrics as m
from ipujax.views.tables.widgets import key_values


def fits_text(report: CostReport) -> Text:
    if report.fits:
        return Text("yes", style="bold green")
    return Text("NO", style="bold white on red")


# ---- summary ---------------------------------------------------------------------------------


def summary_table(report: CostReport) -> Table:
    table = key_values("Summary")
    peak_rate = m.peak_flops_per_second(report)
    table.add_row("target", f"{report.target} ({report.system})")
    table.add_row("IPUs", m.fmt_int(report.ipus))
    table.add_row(
        "tiles",
        f"{report.tiles_per_ipu:,} per IPU ({report.tiles_per_ipu * report.ipus:,} in all), "
        f"{m.fmt_bytes(report.bytes_per_tile)} each",
    )
    table.add_row("clock", f"{report.clock_hz / 1e9:.3f} GHz")
    table.add_row("total cycles", m.fmt_int(report.total_cycles))
    low, high = report.seconds_range  # by the fidelity rows' errors per cost term
    table.add_row(
        "time per step",
        f"{m.fmt_seconds(report.seconds)} ({m.fmt_seconds(low)} to {m.fmt_seconds(high)} by "
        "the fidelity rows' errors)",
    )
    call = report.latency  # host in, device, host out; ipujax/latency.py
    table.add_row(
        "per call",
        f"host in {m.fmt_seconds(call.host_in_seconds)}, device "
        f"{m.fmt_seconds(call.device_seconds)}, host out {m.fmt_seconds(call.host_out_seconds)}"
        + (f" ({call.iterations} device iterations)" if call.iterations > 1 else ""),
    )
    table.add_row(
        "latency, rate",
        f"{m.fmt_seconds(call.latency_seconds)} a call, {call.calls_per_second:,.1f} calls/s",
    )
    table.add_row("supersteps", m.fmt_int(len(report.supersteps)))
    table.add_row(
        "FLOPs",
        f"{m.fmt_int(report.flops)} per IPU, {m.fmt_int(report.system_flops)} in all",
    )
    table.add_row(
        "FLOP utilisation",
        f"{m.fmt_pct(report.flop_utilisation)} of peak "
        f"({report.peak_flops_per_cycle} FLOP/cycle/tile, {peak_rate / 1e12:,.1f} TFLOP/s "
        "for the system)",
    )
    table.add_row(
        "peak tile memory",
        f"{m.fmt_bytes(report.peak_tile_bytes)} of {m.fmt_bytes(report.bytes_per_tile)} "
        f"({m.fmt_pct(m.memory_fraction(report), 1)})",
    )
    table.add_row("fits", fits_text(report))
    if report.caveats:  # what the figures assume: a loop's trips, the unroll limit
        table.add_row("caveats", Text("\n".join(report.caveats), style="yellow"))
    return table

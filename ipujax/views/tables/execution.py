"""The execution tables: cycles by superstep kind, cycles by op and source line, and how evenly
the compute supersteps use the tiles."""

from __future__ import annotations

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from ipujax.report import CostReport
from ipujax.views import metrics as m
from ipujax.views.tables import widgets as w
from ipujax.views.tables.bounds import HEADER, bound_cells


def kinds_table(report: CostReport) -> Table:
    kinds = m.kind_totals(report)
    total = kinds.total or 1
    table = w.titled_table(
        "Execution: cycles by superstep kind",
        "kind",
        "PopVision step",
        "cycles",
        "share",
        "time",
        HEADER,
        numeric=(2, 3, 4, 5),
    )
    bounds = bound_cells(report)  # the supersteps each kind of cycles bounds (bottlenecks)
    for name, step, cycles in kinds.rows():
        table.add_row(
            name,
            step,
            m.fmt_int(cycles),
            m.fmt_pct(cycles / total, 1),
            m.fmt_seconds(cycles / report.clock_hz),
            bounds.get(name, ""),
        )
    table.add_section()
    table.add_row(
        Text("total", style="bold"),
        "",
        Text(m.fmt_int(kinds.total), style="bold"),
        "",
        m.fmt_seconds(kinds.total / report.clock_hz),
    )
    return table


def by_op_table(report: CostReport, top: int = w.TOP_ROWS) -> Table:
    rows = m.by_op_and_source(report)
    total = report.total_cycles or 1
    links = any(r.link for r in rows)  # a column for the IPU-Links only when they are used
    columns = ["op", "source", "steps", "compute", "exchange", "sync"]
    columns += ["IPU-Links"] if links else []
    table = w.titled_table(
        "Execution: cycles by op and source line",
        *columns,
        "cycles",
        "share",
        numeric=tuple(range(2, len(columns) + 2)),
    )
    shown = rows[:top]
    if len(rows) > top:
        shown.append(m.sum_costs(f"... {len(rows) - top} more", rows[top:]))
    for row in shown:
        summed = row.op.startswith("...")  # the rows past `top`, added up
        cells = [
            Text(row.op, style="dim") if summed else row.op,
            w.tail(m.short_source(row.source)) if row.source or not summed else "",
            m.fmt_int(row.steps),
            m.fmt_int(row.compute),
            m.fmt_int(row.exchange),
            m.fmt_int(row.sync),
        ]
        cells += [m.fmt_int(row.link)] if links else []
        table.add_row(*cells, m.fmt_int(row.cycles), m.fmt_pct(row.cycles / total, 1))
    if not rows:
        table.add_row("none", *[""] * (len(columns) + 1))
    return w.whole_numbers(table)


def balance_table(report: CostReport) -> Table:
    table = w.key_values("Execution: tile balance")
    balance = m.tile_balance(report)
    table.add_row(
        "tile balance",
        f"{m.fmt_pct(balance, 1)} (compute-cycle-weighted tiles used: "
        f"{balance * report.tiles_per_ipu:,.1f} of {report.tiles_per_ipu:,})",
    )
    tiles = [s.tiles for s in report.supersteps]
    if tiles:
        table.add_row(
            "tiles per superstep", f"min {min(tiles):,}, max {max(tiles):,} (all supersteps)"
        )
    return table


def execution_tables(report: CostReport, full: bool = True) -> list[RenderableType]:
    top = w.TOP_ROWS if full else w.SHORT_ROWS
    return [kinds_table(report), by_op_table(report, top), balance_table(report)]

"""The communication tables: bytes on chip, over the IPU-Links, to streaming memory and the host;
the collectives, each with why it was needed (`--full`) or grouped by kind, axes and source."""

from __future__ import annotations

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from ipujax.report import CostReport
from ipujax.views import metrics as m
from ipujax.views.tables.widgets import (
    SHORT_ROWS,
    TOP_ROWS,
    key_values,
    tail,
    titled_table,
    whole_numbers,
)


def communication_tables(report: CostReport, full: bool = True) -> list[RenderableType]:
    table = key_values("Communication")
    kinds = m.kind_totals(report)
    table.add_row(
        "on-chip exchange",
        f"{m.fmt_bytes(report.exchange_bytes)} in {m.fmt_int(kinds.exchange)} cycles",
    )
    table.add_row("IPU-Links", m.fmt_bytes(report.ipu_link_bytes))
    table.add_row("streaming memory", m.fmt_bytes(report.streaming_bytes))
    table.add_row(
        "host",
        f"{m.fmt_bytes(report.host_bytes)} in {m.fmt_int(kinds.host)} cycles not hidden",
    )
    out: list[RenderableType] = [table]
    if not report.collectives:
        out.append(Text.assemble(("Collectives (IPU-Link bytes): ", "bold"), "none"))
        return out
    out.append(collectives_table(report) if full else collective_groups_table(report, SHORT_ROWS))
    return out


def collectives_table(report: CostReport) -> Table:
    """Every collective, one row each, with why it was needed (`--full`)."""
    coll = titled_table(
        "Collectives (IPU-Link bytes)",
        "kind",
        "axes",
        "group",
        "bytes per IPU",
        "cycles",
        "op",
        "source",
        "why",
        numeric=(2, 3, 4),
    )
    for c in report.collectives:
        coll.add_row(
            c.kind,
            ",".join(c.axes),
            str(c.group_size),
            m.fmt_int(c.bytes_per_ipu),
            m.fmt_int(c.cycles),
            c.op,
            m.short_source(c.source) if c.source else "",
            m.shorten_paths(c.why),
        )
    return coll


def collective_groups_table(report: CostReport, top: int = TOP_ROWS) -> Table:
    """Collectives grouped by kind, axes and source line: how many, their bytes per IPU and
    cycles, costliest first; the rest summed in one row (`--full` lists each)."""
    groups = m.collective_groups(report)
    table = titled_table(
        f"Collectives (IPU-Link bytes): {len(report.collectives):,} in {len(groups):,} groups",
        "kind",
        "axes",
        "group",
        "source",
        "count",
        "bytes per IPU",
        "cycles",
        numeric=(2, 4, 5, 6),
    )
    for g in groups[:top]:
        table.add_row(
            g.kind,
            ",".join(g.axes),
            str(g.group_size),
            tail(m.short_source(g.source)) if g.source else "",
            m.fmt_int(g.count),
            m.fmt_int(g.bytes_per_ipu),
            m.fmt_int(g.cycles),
        )
    rest = groups[top:]
    if rest:
        table.add_row(
            Text(f"... {len(rest)} more", style="dim"),
            "",
            "",
            "",
            m.fmt_int(sum(g.count for g in rest)),
            m.fmt_int(sum(g.bytes_per_ipu for g in rest)),
            m.fmt_int(sum(g.cycles for g in rest)),
        )
    return whole_numbers(table)

"""The cost report as rich tables for a terminal: summary, memory, execution, communication,
phases. `render(console, report)` prints them all; each `*_tables` function returns renderables so
that other views can reuse them."""

from __future__ import annotations

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from ipujax.report import CostReport, TileUsage
from ipujax.views import metrics as m

TOP_ROWS = 15  # rows of the by-op table before the rest are summed
SHORT_ROWS = 10  # the same, and collective groups, in the default (one screen) summary
BAR_WIDTH = 40
_ONE_LINE = {"op": 14, "source": 24, "kind": 16, "axes": 12}  # column: its widest


def _table(title: str, *columns: str, numeric: tuple[int, ...] = ()) -> Table:
    table = Table(
        title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1)
    )
    for i, name in enumerate(columns):
        if i in numeric:
            table.add_column(name, justify="right", no_wrap=True)
        elif name in _ONE_LINE:  # an op's name and file:line stay on one line, cut short
            width = _ONE_LINE[name]
            table.add_column(
                name, justify="left", no_wrap=True, overflow="ellipsis", max_width=width
            )
        else:
            table.add_column(name, justify="left", overflow="fold")
    return table


def _tail(source: str) -> str:
    """A source cut from the left to fit its one-line column, keeping its file and line."""
    width = _ONE_LINE["source"]
    return source if len(source) <= width else "…" + source[len(source) - width + 1 :]


def _whole_numbers(table: Table) -> Table:
    """Numeric columns at least as wide as their widest cell: when the table is wider than the
    console, Rich cuts the names and sources, never the figures."""
    for column in table.columns:
        if column.justify == "right":
            column.min_width = max((len(str(c)) for c in column.cells), default=0)
    return table


def _key_values(title: str) -> Table:
    table = Table(
        title=title,
        title_justify="left",
        title_style="bold",
        box=box.SIMPLE,
        show_header=False,
        padding=(0, 1),
    )
    table.add_column("what", style="cyan", no_wrap=True)
    table.add_column("value", overflow="fold")
    return table


def fits_text(report: CostReport) -> Text:
    if report.fits:
        return Text("yes", style="bold green")
    return Text("NO", style="bold white on red")


# ---- summary ---------------------------------------------------------------------------------


def summary_table(report: CostReport) -> Table:
    table = _key_values("Summary")
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
    table.add_row("time per step", m.fmt_seconds(report.seconds))
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
    return table


# ---- memory ----------------------------------------------------------------------------------


def peak_per_ipu_table(report: CostReport) -> Table:
    table = _table(
        "Memory: peak per IPU",
        "IPU",
        "peak tile",
        "peak bytes",
        "of budget",
        "mean per tile",
        "all tiles",
        "tiles over budget",
        numeric=(0, 1, 2, 3, 4, 5, 6),
    )
    for label, ipu in m.ipu_groups(report):
        over = Text(f"{ipu.over_budget_tiles:,}", style="bold red" if ipu.over_budget_tiles else "")
        share = ipu.peak / report.bytes_per_tile if report.bytes_per_tile else 0.0
        table.add_row(
            label,
            str(ipu.peak_tile),
            Text(m.fmt_bytes(ipu.peak), style="bold red" if share > 1 else ""),
            m.fmt_pct(share, 1),
            m.fmt_bytes_short(ipu.mean),
            m.fmt_bytes_short(ipu.total),
            over,
        )
    return table


def histogram_table(report: CostReport) -> Table:
    bins = m.histogram(report.tile_memory)
    table = _table(
        f"Memory: tiles by bytes (budget {m.fmt_bytes(report.bytes_per_tile)} per tile)",
        "bytes per tile",
        "tiles",
        "",
        numeric=(1,),
    )
    most = max((b.count for b in bins), default=0)
    for b, label in zip(bins, m.bin_labels(bins), strict=True):
        width = round(BAR_WIDTH * b.count / most) if most else 0
        bar = "█" * width or ("▏" if b.count else "")
        over = b.high > report.bytes_per_tile
        table.add_row(
            Text(label + (" (over)" if over else ""), style="red" if over else ""),
            f"{b.count:,}",
            Text(bar, style="red" if over else "green"),
        )
    return table


def top_tiles_table(report: CostReport, full: bool = True) -> Table:
    """The fullest tiles and their largest tensors; short (`full=False`), the tiles that hold
    the same largest tensors as a fuller one are one row."""
    table = _table(
        "Memory: fullest tiles and their largest tensors",
        "IPU",
        "tile",
        "bytes",
        "tensor bytes",
        "tensor (source line)",
        numeric=(0, 1, 2, 3),
    )
    repeats = []
    for usage, same in zip(report.top_tiles, m.repeated_tensors(report), strict=True):
        if same is not None and not full:
            repeats.append((usage, same))
            continue
        style = "bold red" if usage.bytes > report.bytes_per_tile else ""
        tensors: tuple[tuple[int | str, str], ...] = usage.tensors or ((0, "(none listed)"),)
        if same is not None:
            tensors = (("", f"(the same largest tensors as tile {same})"),)
        for i, (size, what) in enumerate(tensors):
            first = i == 0
            table.add_row(
                str(usage.ipu) if first else "",
                str(usage.tile) if first else "",
                Text(m.fmt_int(usage.bytes), style=style) if first else "",
                m.fmt_int(size) if isinstance(size, int) else size,
                m.shorten_paths(what),
                end_section=i == len(tensors) - 1,
            )
    if repeats:
        table.add_row(*_repeats_row(repeats))
    if not report.top_tiles:
        table.add_row("", "", "", "", "none recorded")
    return table


def _repeats_row(repeats: list[tuple[TileUsage, int]]) -> tuple[str, ...]:
    """One row for the tiles whose largest tensors a fuller tile's row already lists."""
    tiles = ", ".join(str(u.tile) for u, _ in repeats)
    same = ", ".join(str(s) for s in sorted({s for _, s in repeats}))
    most = max(u.bytes for u, _ in repeats)
    return (
        "",
        f"+{len(repeats)}",
        f"≤{m.fmt_int(most)}",
        "",
        f"tiles {tiles}: the same largest tensors as tile {same}",
    )


def liveness_table(report: CostReport) -> Table:
    table = _table(
        "Memory: always-live against not-always-live",
        "IPU",
        "kind",
        "all tiles",
        "fullest tile of this kind",
        "on the peak tile",
        numeric=(0, 2, 3, 4),
    )
    for label, ipu in m.ipu_groups(report):
        table.add_row(
            label,
            "always-live (inputs, constants)",
            m.fmt_bytes(ipu.always_live),
            m.fmt_bytes(ipu.always_live_max),
            m.fmt_bytes(ipu.peak_tile_always_live),
        )
        table.add_row(
            "",
            "not-always-live + code (the rest)",
            m.fmt_bytes(ipu.not_always_live),
            m.fmt_bytes(ipu.not_always_live_max),
            m.fmt_bytes(ipu.peak - ipu.peak_tile_always_live),
            end_section=True,
        )
    return table


def categories_table(report: CostReport) -> RenderableType:
    rows = m.categories(report)
    if not rows:
        return Text.assemble(
            ("Memory: by category: ", "bold"), "not recorded (a report older than version 3)"
        )
    tile = report.top_tiles[0]
    table = _table(
        f"Memory: by category, as PopVision counts it (fullest tile {tile.tile}; one IPU's tiles)",
        "category",
        "PopVision (libpva)",
        "fullest tile",
        "share",
        "all tiles",
        numeric=(2, 3, 4),
    )
    for row in rows:
        table.add_row(
            row.name,
            row.popvision,
            m.fmt_bytes(row.tile_bytes),
            m.fmt_pct(row.tile_bytes / tile.bytes if tile.bytes else 0.0, 1),
            m.fmt_bytes_short(row.ipu_bytes),
        )
    table.add_section()
    table.add_row(
        Text("total", style="bold"),
        "",
        Text(m.fmt_bytes(sum(r.tile_bytes for r in rows)), style="bold"),
        "",
        Text(m.fmt_bytes_short(sum(r.ipu_bytes for r in rows)), style="bold"),
    )
    return table


def memory_tables(report: CostReport, full: bool = True) -> list[RenderableType]:
    """Peak per IPU and the categories; when a tile is over its budget, the fullest tiles too;
    in full, also the tiles' histogram and live ranges."""
    if not full:
        over = () if report.fits else (top_tiles_table(report, full=False),)
        return [peak_per_ipu_table(report), *over, categories_table(report)]
    return [
        peak_per_ipu_table(report),
        histogram_table(report),
        top_tiles_table(report),
        liveness_table(report),
        categories_table(report),
    ]


# ---- execution -------------------------------------------------------------------------------


def kinds_table(report: CostReport) -> Table:
    kinds = m.kind_totals(report)
    total = kinds.total or 1
    table = _table(
        "Execution: cycles by superstep kind",
        "kind",
        "PopVision step",
        "cycles",
        "share",
        "time",
        numeric=(2, 3, 4),
    )
    for name, step, cycles in kinds.rows():
        table.add_row(
            name,
            step,
            m.fmt_int(cycles),
            m.fmt_pct(cycles / total, 1),
            m.fmt_seconds(cycles / report.clock_hz),
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


def by_op_table(report: CostReport, top: int = TOP_ROWS) -> Table:
    rows = m.by_op_and_source(report)
    total = report.total_cycles or 1
    links = any(r.link for r in rows)  # a column for the IPU-Links only when they are used
    columns = ["op", "source", "steps", "compute", "exchange", "sync"]
    columns += ["IPU-Links"] if links else []
    table = _table(
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
        cells = [
            Text(row.op, style="dim") if row.op.startswith("...") else row.op,
            _tail(m.short_source(row.source)) if row.source or not row.op.startswith("...") else "",
            m.fmt_int(row.steps),
            m.fmt_int(row.compute),
            m.fmt_int(row.exchange),
            m.fmt_int(row.sync),
        ]
        cells += [m.fmt_int(row.link)] if links else []
        table.add_row(*cells, m.fmt_int(row.cycles), m.fmt_pct(row.cycles / total, 1))
    if not rows:
        table.add_row("none", *[""] * (len(columns) + 1))
    return _whole_numbers(table)


def balance_table(report: CostReport) -> Table:
    table = _key_values("Execution: tile balance")
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
    top = TOP_ROWS if full else SHORT_ROWS
    return [kinds_table(report), by_op_table(report, top), balance_table(report)]


# ---- communication and phases ----------------------------------------------------------------


def communication_tables(report: CostReport, full: bool = True) -> list[RenderableType]:
    table = _key_values("Communication")
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
    coll = _table(
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
    table = _table(
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
            _tail(m.short_source(g.source)) if g.source else "",
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
    return _whole_numbers(table)


def phases_tables(report: CostReport) -> list[RenderableType]:
    if not report.phases:
        return [Text.assemble(("Phases: ", "bold"), "none (phases=None)")]
    table = _table(
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
    table = _table(
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


def report_renderables(report: CostReport, full: bool = True) -> list[RenderableType]:
    """Every table; with `full=False` the ones that fit a screen: the memory's peak and
    categories, the costliest ops, collectives grouped by kind, axes and source line."""
    return [
        summary_table(report),
        *memory_tables(report, full),
        *execution_tables(report, full),
        *communication_tables(report, full),
        *phases_tables(report),
        *pipeline_tables(report),
    ]


def render(console: Console, report: CostReport, full: bool = True) -> None:
    for renderable in report_renderables(report, full):
        console.print(renderable)
        console.print()


def as_group(report: CostReport, full: bool = True) -> Group:
    return Group(*report_renderables(report, full))

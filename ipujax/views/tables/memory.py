"""The memory tables: the peak per IPU, the tiles' histogram, the fullest tiles and their largest
tensors, always-live against not-always-live bytes, and the bytes by PopVision category."""

from __future__ import annotations

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from ipujax.report import CostReport, TileUsage
from ipujax.views import metrics as m
from ipujax.views.tables.widgets import titled_table

BAR_WIDTH = 40  # characters of the histogram's longest bar


def peak_per_ipu_table(report: CostReport) -> Table:
    table = titled_table(
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
    table = titled_table(
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
    table = titled_table(
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
        tensors = m.largest_tensors(usage, same)
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
    table = titled_table(
        "Memory: always-live against not-always-live",
        "IPU",
        "kind",
        "all tiles",
        "fullest tile of this kind",
        "on the peak tile",
        numeric=(0, 2, 3, 4),
    )
    for label, ipu in m.ipu_groups(report):
        always, rest = ipu.liveness_rows()
        table.add_row(label, *always)
        table.add_row("", *rest, end_section=True)
    return table


def categories_table(report: CostReport) -> RenderableType:
    rows = m.categories(report)
    if not rows:
        return Text.assemble(
            ("Memory: by category: ", "bold"), "not recorded (a report older than version 3)"
        )
    tile = report.top_tiles[0]
    table = titled_table(
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

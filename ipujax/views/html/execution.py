"""The execution section: cycles by op, the timeline of supersteps (each one's kinds of cycles and
the tiles its compute set uses), and the cycle and tile-balance tables."""

from __future__ import annotations

import math

import numpy as np

from ipujax.report import CostReport, SuperstepCost
from ipujax.views import metrics as m
from ipujax.views.html.roofline import roofline_section
from ipujax.views.html.widgets import WIDTH, e, legend, panel, segment, svg, table

TOP_OPS = 15
TOP_LINES = 25

COMPUTE, EXCHANGE, SYNC, LINKS = "#3b75af", "#ef8636", "#9a9a9a", "#8e5ec4"
KIND_COLOURS = (SYNC, EXCHANGE, LINKS, COMPUTE)  # in the order a superstep runs them


def _kind_cycles(s: SuperstepCost) -> tuple[int, int, int, int]:
    """Sync, on-chip exchange, IPU-Links, compute: the order of `KIND_COLOURS`."""
    return (s.sync_cycles, s.exchange_cycles, s.link_cycles, s.compute_cycles)


def _by_op_chart(report: CostReport) -> str:
    ops = m.by_op(report)
    shown = ops[:TOP_OPS]
    if len(ops) > TOP_OPS:
        shown.append(m.sum_costs(f"{len(ops) - TOP_OPS} other ops", ops[TOP_OPS:]))
    if not shown:
        return '<p class="none">no supersteps</p>'
    label_w, value_w, row_h = 180, 190, 24
    bar_w = WIDTH - label_w - value_w
    most = max(c.cycles for c in shown) or 1
    total = report.total_cycles or 1
    rows = []
    for k, c in enumerate(shown):
        y = k * row_h
        x = float(label_w)
        segs = []
        for cycles, colour, kind in (
            (c.compute, COMPUTE, "compute"),
            (c.exchange, EXCHANGE, "exchange"),
            (c.link, LINKS, "IPU-Link"),
            (c.sync, SYNC, "sync"),
        ):
            w = bar_w * cycles / most
            segs.append(
                f'<rect x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="{row_h - 8}" '
                f'fill="{colour}"><title>{e(c.op)}: {cycles:,} {kind} cycles</title></rect>'
            )
            x += w
        rows.append(
            f'<text x="{label_w - 8}" y="{y + row_h / 2 + 4}" font-size="12" text-anchor="end">'
            f"{e(c.op)}</text>{''.join(segs)}"
            f'<text x="{x + 6:.1f}" y="{y + row_h / 2 + 4}" font-size="12">'
            f"{c.cycles:,} ({100 * c.cycles / total:.1f}%)</text>"
        )
    height = len(shown) * row_h + 4
    plot = svg(WIDTH, height, "cycles by op", "".join(rows))
    keys = [("compute (OnTileExecute)", COMPUTE), ("exchange (DoExchange)", EXCHANGE)]
    keys += [("IPU-Links (GlobalExchange)", LINKS)] if m.kind_totals(report).link else []
    return plot + legend((*keys, ("sync", SYNC)))


def _timeline(report: CostReport) -> str:
    """Supersteps in order along the time axis: each a sync, exchange and compute bar; below,
    the share of the IPU's tiles each compute set uses."""
    steps = report.supersteps
    total = sum(s.cycles for s in steps)
    if not total:
        return '<p class="none">no supersteps</p>'
    left, plot_w = 70, WIDTH - 90
    lane_y, lane_h, occ_y, occ_h = 24, 34, 84, 70
    px = plot_w / total
    parts: list[str] = []
    if len(steps) * 3 <= plot_w:  # room to draw each step; else per pixel column
        parts += _timeline_rects(report, left, px, lane_y, lane_h, occ_y, occ_h)
    else:
        parts += _timeline_columns(report, left, plot_w, px, lane_y, lane_h, occ_y, occ_h)
    parts.append(
        f'<text x="{left - 8}" y="{lane_y + lane_h / 2 + 4}" font-size="12" '
        f'text-anchor="end">steps</text>'
        f'<text x="{left - 8}" y="{occ_y + occ_h / 2 + 4}" font-size="12" '
        f'text-anchor="end">tiles</text>'
        f'<line x1="{left}" x2="{left + plot_w}" y1="{occ_y + occ_h}" y2="{occ_y + occ_h}" '
        f'stroke="#b9bfc9"/>'
    )
    seconds = total / report.clock_hz
    for t in m.nice_ticks(seconds):
        x = left + t * report.clock_hz * px
        anchor = "start" if t == 0 else "end" if x > left + plot_w - 30 else "middle"
        label = "0" if t == 0 else m.fmt_seconds(t)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{lane_y - 4}" y2="{occ_y + occ_h + 4}" '
            f'stroke="#c9ced6" stroke-dasharray="2 3"/>'
            f'<text x="{x:.1f}" y="{occ_y + occ_h + 18}" font-size="11" '
            f'text-anchor="{anchor}">{e(label)}</text>'
        )
    parts.append(
        f'<text x="{left}" y="14" font-size="12">{len(steps):,} supersteps, '
        f"{total:,} cycles = {e(m.fmt_seconds(total / report.clock_hz))}</text>"
    )
    height = occ_y + occ_h + 26
    plot = svg(WIDTH, height, "superstep timeline", "".join(parts))
    keys = [("Sync", SYNC), ("DoExchange", EXCHANGE)]
    keys += [("GlobalExchange", LINKS)] if m.kind_totals(report).link else []
    keys += [("OnTileExecute", COMPUTE), ("tiles used by the compute set, of all tiles", "#7fb27f")]
    return plot + legend(keys)


def _timeline_rects(
    report: CostReport, left: int, px: float, lane_y: int, lane_h: int, occ_y: int, occ_h: int
) -> list[str]:
    parts = []
    cursor = 0
    for index, s in enumerate(report.supersteps):
        x0 = left + cursor * px
        rects = []
        x = x0
        for cycles, colour in zip(_kind_cycles(s), KIND_COLOURS, strict=True):
            w = cycles * px
            if w > 0:
                rects.append(
                    f'<rect x="{x:.2f}" y="{lane_y}" width="{w:.2f}" height="{lane_h}" '
                    f'fill="{colour}"/>'
                )
            x += w
        share = s.tiles / report.tiles_per_ipu if report.tiles_per_ipu else 0
        h = occ_h * min(share, 1.0)
        cx = x0 + (s.cycles - s.compute_cycles) * px
        rects.append(
            f'<rect x="{cx:.2f}" y="{occ_y + occ_h - h:.1f}" width="{s.compute_cycles * px:.2f}" '
            f'height="{h:.1f}" fill="#7fb27f"/>'
        )
        title = (
            f"#{index} {s.op} at {m.short_source(s.source)}: {s.cycles:,} cycles "
            f"(sync {s.sync_cycles:,}, exchange {s.exchange_cycles:,}, IPU-Links "
            f"{s.link_cycles:,}, compute {s.compute_cycles:,}) on {s.tiles:,} tiles"
        )
        parts.append(f"<g><title>{e(title)}</title>{''.join(rects)}</g>")
        cursor += s.cycles
    return parts


def _timeline_columns(
    report: CostReport,
    left: int,
    plot_w: int,
    px: float,
    lane_y: int,
    lane_h: int,
    occ_y: int,
    occ_h: int,
) -> list[str]:
    """Too many supersteps to draw one by one: per pixel column, the shares of each kind and
    the compute-weighted tiles in use."""
    columns = int(plot_w)
    kinds = np.zeros((columns, 4))  # cycles of each kind that fall in each column
    tiles = np.zeros(columns)  # compute cycles x tiles, per column
    cursor = 0
    for s in report.supersteps:
        for k, cycles in enumerate(_kind_cycles(s)):
            for col, share in _spread(cursor * px, (cursor + cycles) * px, columns):
                kinds[col, k] += cycles * share
                if k == 3:
                    tiles[col] += cycles * share * s.tiles
            cursor += cycles
    parts = []
    for col in range(columns):
        spent = kinds[col].sum()
        if not spent:
            continue
        y = float(lane_y)
        for k, colour in enumerate(KIND_COLOURS):
            h = lane_h * kinds[col, k] / spent
            if h > 0:
                parts.append(
                    f'<rect x="{left + col}" y="{y:.1f}" width="1" height="{h:.1f}" '
                    f'fill="{colour}"/>'
                )
            y += h
        if kinds[col, 3]:
            share = tiles[col] / kinds[col, 3] / max(report.tiles_per_ipu, 1)
            h = occ_h * min(share, 1.0)
            parts.append(
                f'<rect x="{left + col}" y="{occ_y + occ_h - h:.1f}" width="1" height="{h:.1f}" '
                f'fill="#7fb27f"/>'
            )
    return parts


def _spread(x0: float, x1: float, columns: int) -> list[tuple[int, float]]:
    """(column, share of [x0, x1) that falls in it) for the pixel columns the span covers."""
    if x1 <= x0:
        return []
    first, last = int(x0), min(math.ceil(x1) - 1, columns - 1)
    first = min(first, columns - 1)
    width = x1 - x0
    return [
        (col, (min(x1, col + 1) - max(x0, col)) / width)
        for col in range(first, last + 1)
        if min(x1, col + 1) > max(x0, col)
    ] or [(first, 1.0)]


def _execution_tables(report: CostReport) -> str:
    lines = m.by_op_and_source(report)
    more = (
        f"{len(lines) - TOP_LINES} more (op, source line) groups not shown."
        if (len(lines) > TOP_LINES)
        else ""
    )
    return (
        panel("Cycles by superstep kind", _kinds_table(report))
        + panel("Cycles by op and source line", _lines_table(report, lines), more)
        + panel(
            "Tile balance",
            _balance(report),
            "tile balance = Σ(compute cycles * tiles used) / (Σ compute cycles * tiles per IPU)",
        )
    )


def _kinds_table(report: CostReport) -> str:
    """Cycles, share and time of each superstep kind, and their total."""
    kinds = m.kind_totals(report)
    total = kinds.total or 1
    kind_rows = [
        (name, step, f"{c:,}", m.fmt_pct(c / total, 1), m.fmt_seconds(c / report.clock_hz))
        for name, step, c in kinds.rows()
    ]
    kind_rows.append(
        ("total", "", f"{kinds.total:,}", "", m.fmt_seconds(kinds.total / report.clock_hz))
    )
    return table(
        ("kind", "PopVision step", "cycles", "share", "time"), kind_rows, numeric=(2, 3, 4)
    )


def _lines_table(report: CostReport, lines: list[m.OpCost]) -> str:
    """The costliest `TOP_LINES` (op, source line) groups and their cycles by kind."""
    links = any(c.link for c in lines)  # a column for the IPU-Links only when they are used
    line_rows = [
        (
            c.op,
            m.short_source(c.source),
            f"{c.steps:,}",
            f"{c.compute:,}",
            f"{c.exchange:,}",
            f"{c.sync:,}",
            *([f"{c.link:,}"] if links else []),
            f"{c.cycles:,}",
            m.fmt_pct(c.cycles / (report.total_cycles or 1), 1),
        )
        for c in lines[:TOP_LINES]
    ]
    headers = ["op", "source", "steps", "compute", "exchange", "sync"]
    headers += ["IPU-Links"] if links else []
    return table(
        (*headers, "cycles", "share"),
        line_rows,
        numeric=tuple(range(2, len(headers) + 2)),
        source=(1,),
    )


def _balance(report: CostReport) -> str:
    balance = m.tile_balance(report)
    return (
        f"<p><b>{e(m.fmt_pct(balance, 1))}</b>: the compute supersteps keep on average "
        f"{balance * report.tiles_per_ipu:,.1f} of the {report.tiles_per_ipu:,} tiles busy "
        "(weighted by their compute cycles).</p>"
    )


def execution_section(report: CostReport) -> str:
    """Cycles by op, the timeline, then the tables."""
    return (
        f"{panel('Cycles by op', _by_op_chart(report))}"
        f"{panel('Timeline of supersteps', _timeline(report))}"
        f"{roofline_section(report)}"
        f"{_execution_tables(report)}"
    )


STREAM = "#2a9d8f"


def phase_timeline(report: CostReport) -> str:
    """The step as its phases run: on the compute tiles, each phase's exposed streaming then its
    compute; below, the IO path's window for each phase, drawn where it runs (during the
    previous phase's compute when IO tiles hide it)."""
    total = sum(p.cycles for p in report.phases) or 1
    label_w, lane_h = 110, 26
    scale = (WIDTH - label_w) / total
    compute_lane, io_lane = [], []
    cursor = 0
    for p in report.phases:
        exposed = p.stream_cycles - p.overlapped_cycles
        tip = (
            f"{p.name}: compute {p.compute_cycles:,} cycles, streaming {p.stream_cycles:,} "
            f"({exposed:,} exposed); loads {p.load_bytes:,} B, stores {p.store_bytes:,} B, "
            f"gathers {p.link_bytes:,} B"
        )
        x = label_w + cursor * scale
        compute_lane.append(segment(x, 4, exposed * scale, lane_h - 8, STREAM, tip))
        compute_lane.append(
            segment(x + exposed * scale, 4, p.compute_cycles * scale, lane_h - 8, COMPUTE, tip)
        )
        io_start = label_w + (cursor - p.overlapped_cycles) * scale
        io_lane.append(
            segment(io_start, lane_h + 4, p.stream_cycles * scale, lane_h - 8, STREAM, tip)
        )
        cursor += p.cycles
    labels = (
        f'<text x="{label_w - 8}" y="{lane_h / 2 + 4}" font-size="12" text-anchor="end">'
        "compute tiles</text>"
        f'<text x="{label_w - 8}" y="{lane_h * 1.5 + 4}" font-size="12" text-anchor="end">'
        "IO path</text>"
    )
    plot = svg(WIDTH, 2 * lane_h + 4, "phase timeline", labels + "".join(compute_lane + io_lane))
    return legend([("compute", COMPUTE), ("streaming", STREAM)]) + plot

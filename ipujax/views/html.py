"""The cost report as one self-contained HTML page: tables and inline SVG plots (memory per tile
as a heatmap and a profile against the budget, cycles by op, the superstep timeline).

No scripts, no external CSS, fonts or images: the page opens from a file anywhere. Every piece of
text from the report is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from html import escape

import numpy as np

from ipujax.report import CostReport, SuperstepCost
from ipujax.views import metrics as m

WIDTH = 1100  # plot width in px; the page is 1180 px wide at most
TOP_OPS = 15
TOP_LINES = 25
MAX_HEATMAPS = 16

COMPUTE, EXCHANGE, SYNC, LINKS = "#3b75af", "#ef8636", "#9a9a9a", "#8e5ec4"
KIND_COLOURS = (SYNC, EXCHANGE, LINKS, COMPUTE)  # in the order a superstep runs them
OVER = "#d62728"
# A perceptually even sequential palette (viridis stops), low bytes dark, high bytes bright.
_PALETTE = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))

_CSS = """
* { box-sizing: border-box; }
body { margin: 0; background: #f4f5f7; color: #1d2330;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 24px 48px; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 32px 0 12px; padding-bottom: 4px; border-bottom: 2px solid #d8dce3; }
h3 { font-size: 15px; margin: 20px 0 8px; color: #3a4252; }
.sub { color: #5b6475; margin: 0 0 16px; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 10px; }
.card { background: #fff; border: 1px solid #dde1e7; border-radius: 8px; padding: 10px 14px; }
.card .k { color: #5b6475; font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.card .v { font-size: 20px; font-weight: 600; font-variant-numeric: tabular-nums; }
.card .n { color: #5b6475; font-size: 12px; }
.bad { background: #fdecea; border-color: #f3b4ae; }
.bad .v { color: #b3261e; }
.good .v { color: #1e7b34; }
.panel h3 { margin-top: 2px; }
.panel { background: #fff; border: 1px solid #dde1e7; border-radius: 8px; padding: 12px 16px;
  margin: 0 0 14px; overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 10px; border-bottom: 1px solid #eceef2; text-align: left;
  vertical-align: top; }
th { color: #3a4252; font-weight: 600; background: #f8f9fb; }
td.num, th.num { text-align: right; white-space: nowrap; }
td.src { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12.5px; }
tr.over td { color: #b3261e; font-weight: 600; }
.bar { display: inline-block; height: 10px; background: #5e9fd8; border-radius: 2px; }
.bar.over { background: #d62728; }
.note { color: #5b6475; font-size: 13px; margin: 6px 0 0; }
.none { color: #5b6475; font-style: italic; }
svg { display: block; max-width: 100%; height: auto; }
svg text { font-family: system-ui, "DejaVu Sans", sans-serif; fill: #3a4252; }
.legend span { display: inline-block; margin-right: 16px; font-size: 13px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 5px;
  vertical-align: -1px; border-radius: 2px; }
nav { position: sticky; top: 0; z-index: 1; background: #f4f5f7ee; padding: 6px 0;
  border-bottom: 1px solid #dde1e7; }
nav a { color: #2b5d8e; text-decoration: none; margin-right: 18px; font-weight: 600; }
table.kv td:first-child { width: 190px; color: #3a4252; font-weight: 600; }
footer { color: #7a8394; font-size: 12px; margin-top: 36px; }
"""


# ---- small helpers ---------------------------------------------------------------------------


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _colour(fraction: float) -> str:
    """The palette at `fraction` in [0, 1], as #rrggbb."""
    f = min(max(fraction, 0.0), 1.0) * (len(_PALETTE) - 1)
    i = min(int(f), len(_PALETTE) - 2)
    t = f - i
    a, b = _PALETTE[i], _PALETTE[i + 1]
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(a, b, strict=True))


def _table(
    headers: Sequence[str],
    rows: Iterable[Sequence[object]],
    numeric: Sequence[int] = (),
    source: Sequence[int] = (),
    row_classes: Sequence[str] | None = None,
    cls: str = "",
) -> str:
    head = "".join(
        f'<th class="num">{_e(h)}</th>' if i in numeric else f"<th>{_e(h)}</th>"
        for i, h in enumerate(headers)
    )
    body = []
    for r, row in enumerate(rows):
        cells = []
        for i, cell in enumerate(row):
            cls = "num" if i in numeric else "src" if i in source else ""
            raw = cell if isinstance(cell, _Raw) else _e(cell)
            cells.append(f'<td class="{cls}">{raw}</td>' if cls else f"<td>{raw}</td>")
        cls = row_classes[r] if row_classes and row_classes[r] else ""
        body.append(f'<tr class="{cls}">' if cls else "<tr>")
        body.append("".join(cells) + "</tr>")
    thead = f"<thead><tr>{head}</tr></thead>" if any(headers) else ""
    opening = f'<table class="{cls}">' if cls else "<table>"
    return f"{opening}{thead}<tbody>{''.join(body)}</tbody></table>"


class _Raw(str):
    """Markup this module built itself (already escaped)."""


def _panel(title: str, content: str, note: str = "") -> str:
    note_html = f'<p class="note">{_e(note)}</p>' if note else ""
    return f'<div class="panel"><h3>{_e(title)}</h3>{content}{note_html}</div>'


def _card(key: str, value: str, note: str = "", cls: str = "") -> str:
    return (
        f'<div class="card {cls}"><div class="k">{_e(key)}</div><div class="v">{_e(value)}</div>'
        f'<div class="n">{_e(note)}</div></div>'
    )


def _legend(items: Sequence[tuple[str, str]]) -> str:
    spans = "".join(f'<span><i style="background:{c}"></i>{_e(n)}</span>' for n, c in items)
    return f'<div class="legend">{spans}</div>'


# ---- summary ---------------------------------------------------------------------------------


def _summary(report: CostReport) -> str:
    balance = m.tile_balance(report)
    fits = report.fits
    cards = [
        _card("time per step", m.fmt_seconds(report.seconds), f"{report.total_cycles:,} cycles"),
        _card(
            "FLOP utilisation",
            m.fmt_pct(report.flop_utilisation),
            f"{report.flops:,} FLOPs of {m.peak_flops_per_second(report) / 1e12:,.1f} TFLOP/s",
        ),
        _card(
            "peak tile memory",
            m.fmt_bytes_short(report.peak_tile_bytes),
            f"{m.fmt_pct(m.memory_fraction(report), 1)} of "
            f"{m.fmt_bytes_short(report.bytes_per_tile)}",
            "" if fits else "bad",
        ),
        _card(
            "fits",
            "yes" if fits else "NO",
            "every tile within budget" if fits else "some tile is over budget",
            "good" if fits else "bad",
        ),
        _card("tile balance", m.fmt_pct(balance, 1), "compute-weighted tiles in use"),
        _card("supersteps", f"{len(report.supersteps):,}", f"{report.ipus} IPU(s)"),
    ]
    rows = [
        ("target", f"{report.target} ({report.system})"),
        ("IPUs", f"{report.ipus:,}"),
        ("tiles", f"{report.tiles_per_ipu:,} per IPU, {m.fmt_bytes(report.bytes_per_tile)} each"),
        ("clock", f"{report.clock_hz / 1e9:.3f} GHz"),
        ("total cycles", f"{report.total_cycles:,}"),
        ("time per step", m.fmt_seconds(report.seconds)),
        ("FLOPs", f"{report.flops:,}"),
        (
            "FLOP utilisation",
            f"{m.fmt_pct(report.flop_utilisation)} of peak "
            f"({report.peak_flops_per_cycle} FLOP/cycle/tile)",
        ),
        (
            "peak tile memory",
            f"{m.fmt_bytes(report.peak_tile_bytes)} of {m.fmt_bytes(report.bytes_per_tile)}",
        ),
        ("fits", "yes" if fits else "NO"),
    ]
    table = _table(
        ("", ""),
        rows,
        row_classes=["over" if k == "fits" and not fits else "" for k, _ in rows],
        cls="kv",
    )
    return f'<div class="cards">{"".join(cards)}</div><div class="panel">{table}</div>'


# ---- memory ----------------------------------------------------------------------------------


def _heatmap(report: CostReport, ipu: int) -> str:
    """Tiles of one IPU in a grid, coloured by their peak bytes; a legend with the budget."""
    values = report.tile_memory[ipu]
    n = values.size
    cols = max(1, math.ceil(math.sqrt(n * 2.5)))
    rows = math.ceil(n / cols)
    cell = max(4, min(28, (WIDTH - 20) // cols))
    budget = report.bytes_per_tile
    high = min(int(values.max()) if n else 0, budget)  # tiles over the budget are drawn red
    low = min(int(values.min()) if n else 0, high)
    span = max(high - low, 1)
    parts = []
    for t in range(n):
        x, y = (t % cols) * cell, (t // cols) * cell
        b = int(values[t])
        fill = OVER if b > budget else _colour((b - low) / span if high > low else 0.5)
        parts.append(
            f'<rect x="{x}" y="{y}" width="{cell - 1}" height="{cell - 1}" fill="{fill}">'
            f"<title>IPU {ipu} tile {t}: {b:,} B ({100 * b / budget:.1f}% of budget)</title></rect>"
        )
    grid_h = rows * cell
    legend_y = grid_h + 14
    legend = _heatmap_legend(report, (low, high), legend_y, cols * cell)
    height = legend_y + 46
    return (
        f'<svg width="{cols * cell}" height="{height}" '
        f'viewBox="0 0 {cols * cell} {height}" role="img" '
        f'aria-label="memory per tile, IPU {ipu}">{"".join(parts)}{legend}</svg>'
    )


def _heatmap_legend(report: CostReport, scale: tuple[int, int], y: int, width: int) -> str:
    bar_w = min(420, width - 10)
    steps = 40
    seg = bar_w / steps
    rects = "".join(
        f'<rect x="{i * seg:.1f}" y="{y}" width="{seg + 0.5:.1f}" height="12" '
        f'fill="{_colour(i / (steps - 1))}"/>'
        for i in range(steps)
    )
    budget = report.bytes_per_tile
    if int(report.tile_memory.min(initial=budget + 1)) > budget:
        rects, bar_w = "", -16  # no tile within the budget: only the red key
    labels = (
        ""
        if not rects
        else (
            f'<text x="0" y="{y + 28}" font-size="12">{_e(m.fmt_bytes_short(scale[0]))}</text>'
            f'<text x="{bar_w}" y="{y + 28}" font-size="12" text-anchor="end">'
            f"{_e(m.fmt_bytes_short(scale[1]))}</text>"
        )
    )
    if report.peak_tile_bytes > budget:
        marker = (
            f'<rect x="{bar_w + 16}" y="{y}" width="12" height="12" fill="{OVER}"/>'
            f'<text x="{bar_w + 34}" y="{y + 11}" font-size="12">over the budget of '
            f"{_e(m.fmt_bytes_short(budget))} per tile</text>"
        )
    else:
        marker = (
            f'<text x="{bar_w + 16}" y="{y + 11}" font-size="12">'
            "colour: bytes per tile, least to most; "
            f"budget {_e(m.fmt_bytes_short(budget))} per tile (peak is "
            f"{_e(m.fmt_pct(m.memory_fraction(report), 1))} of it)</text>"
        )
    return rects + labels + marker


def _profile(report: CostReport, ipu: int) -> str:
    """Bytes per tile in tile order (always-live under the rest), with the budget line."""
    total = report.tile_memory[ipu].astype(float)
    live = report.always_live[ipu].astype(float)
    n = total.size
    budget = float(report.bytes_per_tile)
    peak = float(total.max()) if n else 0.0
    on_scale = peak >= 0.2 * budget
    top = max(peak, budget) * 1.05 if on_scale else max(peak, 1.0) * 1.1
    tick_values, top = m.byte_ticks(top)
    left, plot_w, plot_h, pad_top = 70, WIDTH - 90, 200, 22
    xs = np.arange(n + 1) * plot_w / max(n, 1) + left

    def area(values: np.ndarray, colour: str) -> str:
        ys = pad_top + plot_h - np.minimum(values, top) / top * plot_h
        points = [f"{left},{pad_top + plot_h}"]
        for i in range(n):
            points.append(f"{xs[i]:.1f},{ys[i]:.1f} {xs[i + 1]:.1f},{ys[i]:.1f}")
        points.append(f"{xs[n]:.1f},{pad_top + plot_h}")
        return f'<polygon points="{" ".join(points)}" fill="{colour}"/>'

    ticks = []
    for v in tick_values:
        y = pad_top + plot_h - plot_h * v / top
        ticks.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e6eb"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">'
            f"{_e(m.fmt_bytes_short(v))}</text>"
        )
    for k in range(6):
        t = round((n - 1) * k / 5) if n > 1 else 0
        x = left + (t + 0.5) * plot_w / max(n, 1)
        anchor = "start" if k == 0 else "end" if k == 5 else "middle"
        ticks.append(
            f'<text x="{x:.1f}" y="{pad_top + plot_h + 16}" font-size="11" '
            f'text-anchor="{anchor}">tile {t}</text>'
        )
    if on_scale:
        y = pad_top + plot_h - budget / top * plot_h
        budget_mark = (
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="{OVER}" '
            f'stroke-width="2" stroke-dasharray="6 4"/>'
            f'<text x="{left + plot_w - 4}" y="{y - 6:.1f}" font-size="12" text-anchor="end" '
            f'stroke="#fff" stroke-width="4" paint-order="stroke" style="fill:{OVER}">'
            f"budget {_e(m.fmt_bytes_short(budget))} per tile</text>"
        )
    else:
        budget_mark = (
            f'<text x="{left + plot_w}" y="{pad_top - 8}" font-size="12" text-anchor="end" '
            f'style="fill:{OVER}">budget {_e(m.fmt_bytes_short(budget))} per tile is above this '
            f"scale: the peak is {_e(m.fmt_pct(m.memory_fraction(report), 1))} of it</text>"
        )
    height = pad_top + plot_h + 26
    return (
        f'<svg width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="bytes per tile">'
        f"{''.join(ticks)}{area(total, '#9cc3e6')}{area(live, '#2f5f8f')}{budget_mark}</svg>"
    )


def _memory_tables(report: CostReport) -> str:
    groups = m.ipu_groups(report)
    budget = report.bytes_per_tile
    peak_rows = [
        (
            label,
            i.peak_tile,
            m.fmt_bytes(i.peak),
            m.fmt_pct(i.peak / budget if budget else 0, 1),
            m.fmt_bytes_short(i.mean),
            m.fmt_bytes_short(i.total),
            f"{i.over_budget_tiles:,}",
        )
        for label, i in groups
    ]
    peak = _table(
        ("IPU", "peak tile", "peak bytes", "of budget", "mean per tile", "all tiles", "over"),
        peak_rows,
        numeric=range(7),
        row_classes=["over" if i.peak > budget else "" for _, i in groups],
    )
    bins = m.histogram(report.tile_memory)
    most = max((b.count for b in bins), default=1) or 1
    hist_rows = []
    for b, label in zip(bins, m.bin_labels(bins), strict=True):
        over = " over" if b.high > budget else ""
        bar = _Raw(f'<span class="bar{over}" style="width:{360 * b.count / most:.0f}px"></span>')
        hist_rows.append((label, f"{b.count:,}", bar))
    hist = _table(("bytes per tile", "tiles", ""), hist_rows, numeric=(1,))
    live_rows = []
    for label, i in groups:
        live_rows.append(
            (
                label,
                "always-live (inputs, constants)",
                m.fmt_bytes(i.always_live),
                m.fmt_bytes(i.always_live_max),
                m.fmt_bytes(i.peak_tile_always_live),
            )
        )
        live_rows.append(
            (
                label,
                "not-always-live + code (the rest)",
                m.fmt_bytes(i.not_always_live),
                m.fmt_bytes(i.not_always_live_max),
                m.fmt_bytes(i.peak - i.peak_tile_always_live),
            )
        )
    live = _table(
        ("IPU", "kind", "all tiles", "fullest tile of this kind", "on the peak tile"),
        live_rows,
        numeric=(0, 2, 3, 4),
    )
    return (
        _panel("Peak per IPU", peak)
        + _panel("Tiles by bytes (histogram)", hist)
        + _panel("Fullest tiles and their largest tensors", _top_tiles(report))
        + _panel("Always-live against not-always-live", live)
    )


def _top_tiles(report: CostReport) -> str:
    if not report.top_tiles:
        return '<p class="none">none recorded</p>'
    rows = []
    classes = []
    for usage, same in zip(report.top_tiles, m.repeated_tensors(report), strict=True):
        over = "over" if usage.bytes > report.bytes_per_tile else ""
        tensors: tuple[tuple[int | str, str], ...] = usage.tensors or ((0, "(none listed)"),)
        if same is not None:
            tensors = (("", f"(the same largest tensors as tile {same})"),)
        for k, (size, what) in enumerate(tensors):
            first = k == 0
            rows.append(
                (
                    usage.ipu if first else "",
                    usage.tile if first else "",
                    f"{usage.bytes:,}" if first else "",
                    f"{size:,}" if isinstance(size, int) else size,
                    m.shorten_paths(what),
                )
            )
            classes.append(over if first else "")
    return _table(
        ("IPU", "tile", "bytes", "tensor bytes", "tensor (source line)"),
        rows,
        numeric=(0, 1, 2, 3),
        source=(4,),
        row_classes=classes,
    )


def _memory(report: CostReport) -> str:
    maps = []
    groups = m.ipu_groups(report)
    for label, memory in groups[:MAX_HEATMAPS]:
        ipu = memory.ipu
        which = f"IPU {label}" if label == str(ipu) else f"IPUs {label} (alike)"
        maps.append(
            _panel(
                f"Memory per tile, {which} (heatmap: one square per tile, in tile order)",
                _heatmap(report, ipu),
            )
        )
        maps.append(
            _panel(
                f"Bytes per tile, {which}, against the budget",
                _profile(report, ipu)
                + _legend((("always-live", "#2f5f8f"), ("not-always-live + code", "#9cc3e6"))),
            )
        )
    more = (
        f'<p class="note">{len(groups) - MAX_HEATMAPS} more groups of IPUs not drawn.</p>'
        if len(groups) > MAX_HEATMAPS
        else ""
    )
    return "".join(maps) + more + _memory_tables(report)


# ---- execution -------------------------------------------------------------------------------


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
                f'fill="{colour}"><title>{_e(c.op)}: {cycles:,} {kind} cycles</title></rect>'
            )
            x += w
        rows.append(
            f'<text x="{label_w - 8}" y="{y + row_h / 2 + 4}" font-size="12" text-anchor="end">'
            f"{_e(c.op)}</text>{''.join(segs)}"
            f'<text x="{x + 6:.1f}" y="{y + row_h / 2 + 4}" font-size="12">'
            f"{c.cycles:,} ({100 * c.cycles / total:.1f}%)</text>"
        )
    height = len(shown) * row_h + 4
    svg = (
        f'<svg width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="cycles by op">'
        f"{''.join(rows)}</svg>"
    )
    keys = [("compute (OnTileExecute)", COMPUTE), ("exchange (DoExchange)", EXCHANGE)]
    keys += [("IPU-Links (GlobalExchange)", LINKS)] if m.kind_totals(report).link else []
    return svg + _legend((*keys, ("sync", SYNC)))


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
            f'text-anchor="{anchor}">{_e(label)}</text>'
        )
    parts.append(
        f'<text x="{left}" y="14" font-size="12">{len(steps):,} supersteps, '
        f"{total:,} cycles = {_e(m.fmt_seconds(total / report.clock_hz))}</text>"
    )
    height = occ_y + occ_h + 26
    svg = (
        f'<svg width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="superstep timeline">'
        f"{''.join(parts)}</svg>"
    )
    keys = [("Sync", SYNC), ("DoExchange", EXCHANGE)]
    keys += [("GlobalExchange", LINKS)] if m.kind_totals(report).link else []
    keys += [("OnTileExecute", COMPUTE), ("tiles used by the compute set, of all tiles", "#7fb27f")]
    return svg + _legend(keys)


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
        parts.append(f"<g><title>{_e(title)}</title>{''.join(rects)}</g>")
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
    kinds = m.kind_totals(report)
    total = kinds.total or 1
    kind_rows = [
        (name, step, f"{c:,}", m.fmt_pct(c / total, 1), m.fmt_seconds(c / report.clock_hz))
        for name, step, c in (
            ("compute", "OnTileExecute", kinds.compute),
            ("exchange", "DoExchange", kinds.exchange),
            ("sync", "Sync", kinds.sync),
            ("IPU-Links", "GlobalExchange", kinds.link),
        )
    ]
    kind_rows.append(
        ("total", "", f"{kinds.total:,}", "", m.fmt_seconds(kinds.total / report.clock_hz))
    )
    kinds_html = _table(
        ("kind", "PopVision step", "cycles", "share", "time"), kind_rows, numeric=(2, 3, 4)
    )
    lines = m.by_op_and_source(report)
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
    lines_html = _table(
        (*headers, "cycles", "share"),
        line_rows,
        numeric=tuple(range(2, len(headers) + 2)),
        source=(1,),
    )
    more = (
        f"{len(lines) - TOP_LINES} more (op, source line) groups not shown."
        if (len(lines) > TOP_LINES)
        else ""
    )
    balance = m.tile_balance(report)
    balance_html = (
        f"<p><b>{_e(m.fmt_pct(balance, 1))}</b>: the compute supersteps keep on average "
        f"{balance * report.tiles_per_ipu:,.1f} of the {report.tiles_per_ipu:,} tiles busy "
        "(weighted by their compute cycles).</p>"
    )
    return (
        _panel("Cycles by superstep kind", kinds_html)
        + _panel("Cycles by op and source line", lines_html, more)
        + _panel(
            "Tile balance",
            balance_html,
            "tile balance = Σ(compute cycles * tiles used) / (Σ compute cycles * tiles per IPU)",
        )
    )


# ---- communication and phases ----------------------------------------------------------------


def _communication(report: CostReport) -> str:
    kinds = m.kind_totals(report)
    rows = [
        ("on-chip exchange", f"{m.fmt_bytes(report.exchange_bytes)} in {kinds.exchange:,} cycles"),
        ("IPU-Links", m.fmt_bytes(report.ipu_link_bytes)),
        ("streaming memory", m.fmt_bytes(report.streaming_bytes)),
        ("host", "not modelled yet"),
    ]
    overview = _table(("traffic", "bytes"), rows)
    if report.collectives:
        coll = _table(
            ("kind", "axes", "group", "bytes per IPU", "cycles", "op", "source", "why"),
            [
                (
                    c.kind,
                    ",".join(c.axes),
                    c.group_size,
                    f"{c.bytes_per_ipu:,}",
                    f"{c.cycles:,}",
                    c.op,
                    m.short_source(c.source) if c.source else "",
                    c.why,
                )
                for c in report.collectives
            ],
            numeric=(2, 3, 4),
            source=(6,),
        )
    else:
        coll = '<p class="none">none</p>'
    return _panel("Traffic", overview) + _panel("Collectives (IPU-Link bytes)", coll)


def _phases(report: CostReport) -> str:
    if not report.phases:
        return _panel("Phases", '<p class="none">none (phases=None)</p>')
    table = _table(
        ("phase", "cycles", "streaming bytes", "peak tile bytes"),
        [
            (p.name, f"{p.cycles:,}", f"{p.streaming_bytes:,}", f"{p.peak_tile_bytes:,}")
            for p in report.phases
        ],
        numeric=(1, 2, 3),
        row_classes=[
            "over" if p.peak_tile_bytes > report.bytes_per_tile else "" for p in report.phases
        ],
    )
    return _panel("Phases", table)


# ---- the page --------------------------------------------------------------------------------


def _nav() -> str:
    links = "".join(
        f'<a href="#{anchor}">{name}</a>'
        for anchor, name in (
            ("summary", "Summary"),
            ("memory", "Memory"),
            ("execution", "Execution"),
            ("communication", "Communication"),
            ("phases", "Phases"),
        )
    )
    return f"<nav>{links}</nav>"


def render_html(report: CostReport, title: str = "ipujax cost report") -> str:
    heading = f"{title}: {report.target}, {report.ipus} IPU(s), {report.tiles_per_ipu:,} tiles"
    subtitle = (
        f"{report.system}; {report.total_cycles:,} cycles per step at "
        f"{report.clock_hz / 1e9:.3f} GHz = {m.fmt_seconds(report.seconds)}; "
        f"{'fits' if report.fits else 'does NOT fit'} in tile memory"
    )
    body = (
        f'<h1>{_e(heading)}</h1><p class="sub">{_e(subtitle)}</p>'
        f"{_nav()}"
        f'<h2 id="summary">Summary</h2>{_summary(report)}'
        f'<h2 id="memory">Memory</h2>{_memory(report)}'
        f'<h2 id="execution">Execution</h2>'
        f"{_panel('Cycles by op', _by_op_chart(report))}"
        f"{_panel('Timeline of supersteps', _timeline(report))}"
        f"{_execution_tables(report)}"
        f'<h2 id="communication">Communication</h2>{_communication(report)}'
        f'<h2 id="phases">Phases</h2>{_phases(report)}'
        "<footer>Generated by ipujax from the cost model (no measurement). Definitions: "
        "docs/cli.md.</footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(heading)}</title><style>{_CSS}</style></head>"
        f"<body><main>{body}</main></body></html>\n"
    )

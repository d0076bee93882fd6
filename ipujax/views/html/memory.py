"""The memory section: per IPU, a heatmap of the tiles and their bytes against the budget; the
peak, histogram, fullest-tile and liveness tables."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ipujax.report import CostReport
from ipujax.views import metrics as m
from ipujax.views.html.widgets import WIDTH, Raw, e, legend, panel, svg, table

MAX_HEATMAPS = 16
OVER = "#d62728"
# Within the budget: a perceptually even sequential palette (viridis stops), low bytes dark,
# high bytes bright.
_PALETTE = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))
# Past the budget: a second palette of other hues (reds, pale to `OVER`), from the budget to the
# fullest tile, so that a tile at 101% of the budget and one at 190% still look different.
_OVER_PALETTE = ((252, 187, 161), (251, 106, 74), (214, 39, 40))
LEGEND_BAR = 300  # px of the within-budget colour bar; the over-budget one is `LEGEND_OVER`
LEGEND_OVER = 200
_LEFT, _PLOT_W, _PLOT_H, _PAD_TOP = 70, WIDTH - 90, 200, 22  # the profile's frame, in px


def _colour(fraction: float, palette: tuple[tuple[int, int, int], ...] = _PALETTE) -> str:
    """`palette` at `fraction` in [0, 1], as #rrggbb."""
    f = min(max(fraction, 0.0), 1.0) * (len(palette) - 1)
    i = min(int(f), len(palette) - 2)
    t = f - i
    a, b = palette[i], palette[i + 1]
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(a, b, strict=True))


@dataclass(frozen=True, slots=True)
class HeatScale:
    """Where a heatmap's colours sit: the emptiest tile, the budget and the fullest tile."""

    low: int
    budget: int
    high: int

    @classmethod
    def of(cls, values: np.ndarray, budget: int) -> HeatScale:
        if not values.size:
            return cls(0, budget, 0)
        return cls(int(values.min()), budget, int(values.max()))

    @property
    def top(self) -> int:
        """The top of the within-budget scale: the fullest tile, or the budget if it is over."""
        return min(self.high, self.budget)

    @property
    def any_within(self) -> bool:
        return self.low <= self.budget

    @property
    def any_over(self) -> bool:
        return self.high > self.budget

    def fill(self, nbytes: int) -> str:
        """A tile's colour: the first palette up to the budget, the second past it."""
        if nbytes > self.budget:
            return _colour((nbytes - self.budget) / (self.high - self.budget), _OVER_PALETTE)
        span = self.top - self.low
        return _colour((nbytes - self.low) / span if span > 0 else 0.5)


def _heatmap(report: CostReport, ipu: int) -> str:
    """Tiles of one IPU in a grid, coloured by their peak bytes; a legend with the budget."""
    values = report.tile_memory[ipu]
    n = values.size
    cols = max(1, math.ceil(math.sqrt(n * 2.5)))
    rows = math.ceil(n / cols)
    cell = max(4, min(28, (WIDTH - 20) // cols))
    budget = report.bytes_per_tile
    scale = HeatScale.of(values, budget)
    parts = []
    for t in range(n):
        x, y = (t % cols) * cell, (t // cols) * cell
        b = int(values[t])
        parts.append(
            f'<rect x="{x}" y="{y}" width="{cell - 1}" height="{cell - 1}" '
            f'fill="{scale.fill(b)}">'
            f"<title>IPU {ipu} tile {t}: {b:,} B ({100 * b / budget:.1f}% of budget)</title></rect>"
        )
    legend_y = rows * cell + 14
    key = _heatmap_legend(scale, legend_y)
    # As wide as the page's plots whatever the grid's width, so the legend's words fit.
    return svg(
        max(cols * cell, WIDTH), legend_y + 46, f"memory per tile, IPU {ipu}", "".join(parts) + key
    )


def _bar(x: float, y: int, width: int, palette: tuple[tuple[int, int, int], ...]) -> str:
    """A colour bar of `palette` from `x`, `width` px wide."""
    steps = 40
    seg = width / steps
    return "".join(
        f'<rect x="{x + i * seg:.1f}" y="{y}" width="{seg + 0.5:.1f}" height="12" '
        f'fill="{_colour(i / (steps - 1), palette)}"/>'
        for i in range(steps)
    )


def _label(x: float, y: int, text: str, anchor: str = "start") -> str:
    return f'<text x="{x:.1f}" y="{y}" font-size="12" text-anchor="{anchor}">{e(text)}</text>'


def _heatmap_legend(scale: HeatScale, y: int) -> str:
    """The colour bars with their ends in bytes: the within-budget one from the emptiest tile,
    then (when a tile is over) the over-budget one from the budget, marked, to the fullest."""
    parts, x = [], 0.0
    short = m.fmt_bytes_short
    if scale.any_within:
        parts += [_bar(0, y, LEGEND_BAR, _PALETTE), _label(0, y + 28, short(scale.low))]
        x = LEGEND_BAR
        if not scale.any_over:
            parts.append(_label(x, y + 28, short(scale.top), "end"))
    if scale.any_over:
        parts += [
            _bar(x, y, LEGEND_OVER, _OVER_PALETTE),
            f'<line x1="{x}" x2="{x}" y1="{y - 4}" y2="{y + 16}" stroke="#1d2330" '
            'stroke-width="2"/>',
            _label(x, y + 28, f"budget {short(scale.budget)}", "middle" if x else "start"),
            _label(x + LEGEND_OVER, y + 28, short(scale.high), "end"),
        ]
        x += LEGEND_OVER
    return "".join(parts) + _label(x + 16, y + 11, _legend_words(scale))


def _legend_words(scale: HeatScale) -> str:
    budget = m.fmt_bytes_short(scale.budget)
    peak = m.fmt_pct(scale.high / scale.budget if scale.budget else 0.0, 1)
    if scale.any_over:
        return (
            f"colour: bytes per tile; reds are over the budget of {budget} per tile (the "
            f"fullest is {peak} of it)"
        )
    return f"colour: bytes per tile, least to most; budget {budget} per tile (peak is {peak} of it)"


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
    ticks = _byte_ticks(tick_values, top) + _tile_ticks(n)
    mark = _budget_line(budget, top) if on_scale else _budget_above(report, budget)
    height = _PAD_TOP + _PLOT_H + 26
    areas = _area(total, n, top, "#9cc3e6") + _area(live, n, top, "#2f5f8f")
    body = f"{ticks}{areas}{mark}"
    return svg(WIDTH, height, "bytes per tile", body)


def _area(values: np.ndarray, n: int, top: float, colour: str) -> str:
    """A step outline of the first `n` values (one step per tile), filled down to the axis."""
    xs = np.arange(n + 1) * _PLOT_W / max(n, 1) + _LEFT
    ys = _PAD_TOP + _PLOT_H - np.minimum(values, top) / top * _PLOT_H
    points = [f"{_LEFT},{_PAD_TOP + _PLOT_H}"]
    for i in range(n):
        points.append(f"{xs[i]:.1f},{ys[i]:.1f} {xs[i + 1]:.1f},{ys[i]:.1f}")
    points.append(f"{xs[n]:.1f},{_PAD_TOP + _PLOT_H}")
    return f'<polygon points="{" ".join(points)}" fill="{colour}"/>'


def _byte_ticks(tick_values: list[float], top: float) -> str:
    """The horizontal grid lines, labelled in bytes."""
    ticks = []
    for v in tick_values:
        y = _PAD_TOP + _PLOT_H - _PLOT_H * v / top
        ticks.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + _PLOT_W}" y1="{y:.1f}" y2="{y:.1f}" '
            f'stroke="#e3e6eb"/>'
            f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">'
            f"{e(m.fmt_bytes_short(v))}</text>"
        )
    return "".join(ticks)


def _tile_ticks(n: int) -> str:
    """Six tile numbers along the bottom, from the first tile to the last."""
    ticks = []
    for k in range(6):
        t = round((n - 1) * k / 5) if n > 1 else 0
        x = _LEFT + (t + 0.5) * _PLOT_W / max(n, 1)
        anchor = "start" if k == 0 else "end" if k == 5 else "middle"
        ticks.append(
            f'<text x="{x:.1f}" y="{_PAD_TOP + _PLOT_H + 16}" font-size="11" '
            f'text-anchor="{anchor}">tile {t}</text>'
        )
    return "".join(ticks)


def _budget_line(budget: float, top: float) -> str:
    """The budget as a dashed line across the plot, when the scale reaches it."""
    y = _PAD_TOP + _PLOT_H - budget / top * _PLOT_H
    return (
        f'<line x1="{_LEFT}" x2="{_LEFT + _PLOT_W}" y1="{y:.1f}" y2="{y:.1f}" stroke="{OVER}" '
        f'stroke-width="2" stroke-dasharray="6 4"/>'
        f'<text x="{_LEFT + _PLOT_W - 4}" y="{y - 6:.1f}" font-size="12" text-anchor="end" '
        f'stroke="#fff" stroke-width="4" paint-order="stroke" style="fill:{OVER}">'
        f"budget {e(m.fmt_bytes_short(budget))} per tile</text>"
    )


def _budget_above(report: CostReport, budget: float) -> str:
    """A note that the budget is off the top of a scale fitted to tiles far below it."""
    return (
        f'<text x="{_LEFT + _PLOT_W}" y="{_PAD_TOP - 8}" font-size="12" text-anchor="end" '
        f'style="fill:{OVER}">budget {e(m.fmt_bytes_short(budget))} per tile is above this '
        f"scale: the peak is {e(m.fmt_pct(m.memory_fraction(report), 1))} of it</text>"
    )


def _memory_tables(report: CostReport) -> str:
    groups = m.ipu_groups(report)
    return (
        panel("Peak per IPU", _peak_table(report, groups))
        + panel("Tiles by bytes (histogram)", _histogram(report))
        + panel("Fullest tiles and their largest tensors", _top_tiles(report))
        + panel("Always-live against not-always-live", _liveness(groups))
        + panel("By category, as PopVision counts it", _categories(report))
    )


def _peak_table(report: CostReport, groups: list[tuple[str, m.IpuMemory]]) -> str:
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
    return table(
        ("IPU", "peak tile", "peak bytes", "of budget", "mean per tile", "all tiles", "over"),
        peak_rows,
        numeric=range(7),
        row_classes=["over" if i.peak > budget else "" for _, i in groups],
    )


def _histogram(report: CostReport) -> str:
    """Tiles by bytes, a bar per bin; the bins past the budget in red."""
    bins = m.histogram(report.tile_memory)
    most = max((b.count for b in bins), default=1) or 1
    hist_rows = []
    for b, label in zip(bins, m.bin_labels(bins), strict=True):
        over = " over" if b.high > report.bytes_per_tile else ""
        bar = Raw(f'<span class="bar{over}" style="width:{360 * b.count / most:.0f}px"></span>')
        hist_rows.append((label, f"{b.count:,}", bar))
    return table(("bytes per tile", "tiles", ""), hist_rows, numeric=(1,))


def _liveness(groups: list[tuple[str, m.IpuMemory]]) -> str:
    """Per group of IPUs, a row of always-live bytes and a row of the rest."""
    live_rows = [(label, *row) for label, i in groups for row in i.liveness_rows()]
    return table(
        ("IPU", "kind", "all tiles", "fullest tile of this kind", "on the peak tile"),
        live_rows,
        numeric=(0, 2, 3, 4),
    )


def _categories(report: CostReport) -> str:
    """The fullest tile's bytes by category, with a bar of its share, and one IPU's."""
    rows = m.categories(report)
    if not rows:
        return '<p class="none">not recorded (a report older than version 3)</p>'
    tile = report.top_tiles[0]
    share = [r.tile_bytes / tile.bytes if tile.bytes else 0.0 for r in rows]
    cells = [
        (
            r.name,
            r.popvision,
            m.fmt_bytes(r.tile_bytes),
            m.fmt_pct(f, 1),
            Raw(f'<span class="bar" style="width:{360 * f:.0f}px"></span>'),
            m.fmt_bytes_short(r.ipu_bytes),
        )
        for r, f in zip(rows, share, strict=True)
    ]
    heading = ("category", "PopVision (libpva)", f"tile {tile.tile}", "share", "", "all tiles")
    return table(heading, cells, numeric=(2, 3, 5))


def _top_tiles(report: CostReport) -> str:
    if not report.top_tiles:
        return '<p class="none">none recorded</p>'
    rows = []
    classes = []
    for usage, same in zip(report.top_tiles, m.repeated_tensors(report), strict=True):
        over = "over" if usage.bytes > report.bytes_per_tile else ""
        tensors = m.largest_tensors(usage, same)
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
    return table(
        ("IPU", "tile", "bytes", "tensor bytes", "tensor (source line)"),
        rows,
        numeric=(0, 1, 2, 3),
        source=(4,),
        row_classes=classes,
    )


def memory_section(report: CostReport) -> str:
    """Heatmaps and profiles of the first groups of alike IPUs, then the tables."""
    maps = []
    groups = m.ipu_groups(report)
    for label, memory in groups[:MAX_HEATMAPS]:
        ipu = memory.ipu
        which = f"IPU {label}" if label == str(ipu) else f"IPUs {label} (alike)"
        maps.append(
            panel(
                f"Memory per tile, {which} (heatmap: one square per tile, in tile order)",
                _heatmap(report, ipu),
            )
        )
        maps.append(
            panel(
                f"Bytes per tile, {which}, against the budget",
                _profile(report, ipu)
                + legend((("always-live", "#2f5f8f"), ("not-always-live + code", "#9cc3e6"))),
            )
        )
    more = (
        f'<p class="note">{len(groups) - MAX_HEATMAPS} more groups of IPUs not drawn.</p>'
        if len(groups) > MAX_HEATMAPS
        else ""
    )
    return "".join(maps) + more + _memory_tables(report)

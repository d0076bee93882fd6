"""What bounds the step, drawn: a roofline of the program's compute sets (each op and source
line's FLOPs per byte its exchange brings, against the FLOP/s it achieves over its supersteps'
cycles), under the IPU's peak rate and its exchange's bandwidth; and the table of what bounds
the supersteps (`ipujax.bottlenecks`).

An IPU's operands live in its tiles' SRAM, which the vertices read at their own rates (the
cycles of `partitioner.cost`); what a compute set waits on beyond them is the exchange that
brings its operands to the tiles, so the exchange is the bandwidth roof. Inline SVG, no script.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ipujax.bottlenecks import bound, bound_totals
from ipujax.report import CostReport
from ipujax.views import metrics as m
from ipujax.views.html.widgets import WIDTH, e, panel, svg, table
from partitioner import Target

MOST_POINTS = 300  # the costliest compute sets drawn; the rest summed in the note
LEFT, BOTTOM, TOP, RIGHT, HEIGHT = 70, 40, 14, 20, 360
POINT, ROOF = "#3b75af", "#c0392b"


@dataclass(frozen=True, slots=True)
class ComputeSet:
    """An op and source line's compute supersteps, added up."""

    name: str
    source: str
    flops: int
    exchange_bytes: int
    cycles: int
    bound: str

    def intensity(self, floor: float) -> float:
        """FLOPs per exchanged byte; a set that exchanges nothing at `floor` x the largest."""
        return self.flops / self.exchange_bytes if self.exchange_bytes else floor


def compute_sets(report: CostReport) -> list[ComputeSet]:
    """The compute supersteps with FLOPs, by name and source line, costliest first."""
    found: dict[tuple[str, str], list] = {}
    for s in report.supersteps:
        if s.kind == "compute" and s.flops > 0 and s.cycles > 0:
            found.setdefault((s.name, s.source), []).append(s)
    sets = [
        ComputeSet(
            name,
            source,
            sum(s.flops for s in steps),
            sum(s.exchange_bytes for s in steps),
            sum(s.cycles for s in steps),
            bound(max(steps, key=lambda s: s.cycles)),
        )
        for (name, source), steps in found.items()
    ]
    return sorted(sets, key=lambda c: -c.cycles)


@dataclass(frozen=True, slots=True)
class Roofs:
    """Per IPU: the peak FLOP/s at the program's matmul precision, the exchange's bytes/s;
    and the clock, which turns cycles into seconds."""

    peak: float
    exchange: float
    clock_hz: float

    @property
    def ridge(self) -> float:
        return self.peak / self.exchange


def roofs(report: CostReport) -> Roofs:
    """The report's chip with the rates every preset shares (`Target`'s own)."""
    chip = Target(report.target, report.tiles_per_ipu, report.bytes_per_tile, report.clock_hz)
    tiles = report.tiles_per_ipu * report.clock_hz
    return Roofs(
        report.peak_flops_per_cycle * tiles,
        chip.exchange_bytes_per_cycle * tiles,
        report.clock_hz,
    )


class _Axes:
    """Log-log axes over [x0, x1] x [y0, y1] in the plot's pixels."""

    def __init__(self, x0: float, x1: float, y0: float, y1: float) -> None:
        self.lx = (math.log10(x0), math.log10(x1))
        self.ly = (math.log10(y0), math.log10(y1))
        self.w, self.h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(self, value: float) -> float:
        a, b = self.lx
        return LEFT + self.w * (math.log10(value) - a) / (b - a)

    def y(self, value: float) -> float:
        a, b = self.ly
        return TOP + self.h * (1 - (math.log10(value) - a) / (b - a))

    def decades(self, span: tuple[float, float]) -> range:
        return range(math.ceil(span[0]), math.floor(span[1]) + 1)


def _axes(sets: list[ComputeSet], r: Roofs) -> tuple[_Axes, float]:
    """Axes holding every point and both roofs; a set that exchanges nothing sits at the
    right edge (the returned intensity)."""
    exchanged = [c.flops / c.exchange_bytes for c in sets if c.exchange_bytes]
    most = max([*exchanged, r.ridge])
    floor = most * 4
    rates = [_rate(c, r) for c in sets]
    low_x = min([*exchanged, r.ridge]) / 4
    return _Axes(low_x, floor * 2, min(rates) / 4, r.peak * 2), floor


def _rate(c: ComputeSet, r: Roofs) -> float:
    """The set's FLOP/s per IPU over its supersteps' cycles."""
    return c.flops * r.clock_hz / c.cycles


def _grid(ax: _Axes) -> str:
    parts = []
    for d in ax.decades(ax.lx):
        x = ax.x(10.0**d)
        parts.append(
            f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{HEIGHT - BOTTOM}" stroke="#ddd"/>'
            f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" font-size="11" text-anchor="middle">'
            f"1e{d}</text>"
        )
    for d in ax.decades(ax.ly):
        y = ax.y(10.0**d)
        parts.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#ddd"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">1e{d}</text>'
        )
    parts.append(
        f'<text x="{LEFT + ax.w / 2}" y="{HEIGHT - 6}" font-size="12" text-anchor="middle">'
        "FLOPs per byte exchanged</text>"
        f'<text x="14" y="{TOP + ax.h / 2}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {TOP + ax.h / 2})">FLOP/s per IPU</text>'
    )
    return "".join(parts)


def _roof_lines(ax: _Axes, r: Roofs) -> str:
    """The exchange's slope up to the ridge, then the peak."""
    x0 = 10.0 ** ax.lx[0]
    x1 = 10.0 ** ax.lx[1]
    points = [(x0, x0 * r.exchange), (r.ridge, r.peak), (x1, r.peak)]
    path = " ".join(f"{ax.x(x):.1f},{ax.y(max(y, 10.0 ** ax.ly[0])):.1f}" for x, y in points)
    return (
        f'<polyline points="{path}" fill="none" stroke="{ROOF}" stroke-width="2"/>'
        f'<text x="{WIDTH - RIGHT - 4}" y="{ax.y(r.peak) - 6:.1f}" font-size="11" '
        f'text-anchor="end" fill="{ROOF}">peak {r.peak / 1e12:,.1f} TFLOP/s</text>'
        f'<text x="{ax.x(r.ridge) - 6:.1f}" y="{ax.y(r.peak) + 16:.1f}" font-size="11" '
        f'text-anchor="end" fill="{ROOF}">exchange {r.exchange / 1e12:,.2f} TB/s</text>'
    )


def _points(ax: _Axes, sets: list[ComputeSet], r: Roofs, floor: float) -> str:
    most = max(c.cycles for c in sets)
    parts = []
    for c in sets:
        x, y = ax.x(c.intensity(floor)), ax.y(_rate(c, r))
        radius = 3 + 9 * math.sqrt(c.cycles / most)
        tip = (
            f"{c.name} at {m.short_source(c.source)}: {c.flops:,} FLOPs, "
            f"{c.exchange_bytes:,} B exchanged, {c.cycles:,} cycles, "
            f"{_rate(c, r) / 1e12:,.3f} TFLOP/s; bound by {c.bound}"
        )
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{radius:.1f}" fill="{POINT}" '
            f'fill-opacity="0.55" stroke="{POINT}"><title>{e(tip)}</title></circle>'
        )
    return "".join(parts)


def roofline(report: CostReport) -> str:
    """The roofline plot and its note, or a line saying there is nothing to draw."""
    sets = compute_sets(report)
    if not sets:
        return '<p class="none">no compute set with FLOPs</p>'
    r = roofs(report)
    shown = sets[:MOST_POINTS]
    ax, floor = _axes(shown, r)
    body = _grid(ax) + _roof_lines(ax, r) + _points(ax, shown, r, floor)
    note = (
        f"{len(shown):,} of {len(sets):,} compute sets (op and source line), the costliest; "
        "a point's area is its cycles. Sets that exchange nothing sit at the right edge. "
        "Roofs per IPU: the AMP peak at the program's matmul precision and the exchange's "
        f"{r.exchange / r.clock_hz / report.tiles_per_ipu:.0f} bytes a cycle "
        "per tile."
    )
    return (
        svg(WIDTH, HEIGHT, "roofline of the compute sets", body) + f'<p class="note">{e(note)}</p>'
    )


def bounds_html(report: CostReport) -> str:
    """The supersteps by what bounds them."""
    total = sum(s.cycles for s in report.supersteps) or 1
    rows = [
        (b.bound, f"{b.steps:,}", f"{b.cycles:,}", m.fmt_pct(b.cycles / total, 1), b.costliest)
        for b in bound_totals(report.supersteps)
    ]
    headers = ("bound", "supersteps", "cycles", "share", "costliest superstep")
    return table(headers, rows, numeric=(1, 2, 3))


def roofline_section(report: CostReport) -> str:
    return panel("Roofline of the compute sets", roofline(report)) + panel(
        "What bounds the supersteps",
        bounds_html(report),
        "A superstep's bound is its longest part: compute, exchange, sync, links (a "
        "collective's ring, a pipeline's sends), streaming or host.",
    )

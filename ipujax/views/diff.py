"""Two cost reports side by side with their deltas, absolute and relative, like PopVision's report
comparison: the summary fields, cycles by op, memory.

A delta is B - A; its percentage is relative to A. Deltas are green when B is better (fewer
cycles or bytes; higher utilisation or tile balance), red when worse, plain when neither applies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from ipujax.report import CostReport
from ipujax.views import metrics as m

TOP_OPS = 20
LOWER, HIGHER, NEUTRAL = "lower", "higher", "neutral"


@dataclass(frozen=True)
class Field:
    """One compared quantity: how to read it from a report, print it, and which way is better."""

    label: str
    get: Callable[[CostReport], Any]
    unit: str = "int"  # int | bytes | seconds | fraction | ghz | rate | text
    better: str = LOWER


def _total_memory(r: CostReport, what: str) -> int:
    return sum(getattr(i, what) for i in m.ipu_memory(r))


SUMMARY: tuple[Field, ...] = (
    Field("target", lambda r: r.target, "text", NEUTRAL),
    Field("system", lambda r: r.system, "text", NEUTRAL),
    Field("IPUs", lambda r: r.ipus, "int", NEUTRAL),
    Field("tiles per IPU", lambda r: r.tiles_per_ipu, "int", NEUTRAL),
    Field("clock", lambda r: r.clock_hz, "ghz", NEUTRAL),
    Field("total cycles", lambda r: r.total_cycles),
    Field("time per step", lambda r: r.seconds, "seconds"),
    Field("supersteps", lambda r: len(r.supersteps)),
    Field("FLOPs", lambda r: r.flops, "int", NEUTRAL),
    Field("FLOP utilisation", lambda r: r.flop_utilisation, "fraction", HIGHER),
    Field("compute cycles", lambda r: m.kind_totals(r).compute),
    Field("on-tile copy cycles", lambda r: m.kind_totals(r).copies),
    Field("exchange cycles", lambda r: m.kind_totals(r).exchange),
    Field("sync cycles", lambda r: m.kind_totals(r).sync),
    Field("IPU-Link cycles", lambda r: m.kind_totals(r).link),
    Field("tile balance", m.tile_balance, "fraction", HIGHER),
    Field("exchange bytes", lambda r: r.exchange_bytes, "bytes"),
    Field("IPU-Link bytes", lambda r: r.ipu_link_bytes, "bytes"),
    Field("streaming bytes", lambda r: r.streaming_bytes, "bytes"),
    Field("host bytes", lambda r: r.host_bytes, "bytes"),
    Field("device iterations", lambda r: r.device_iterations, "int", NEUTRAL),
    Field("seconds per call", lambda r: r.latency.seconds_per_call, "seconds"),
    Field("calls per second", lambda r: r.latency.calls_per_second, "rate", HIGHER),
    Field("numerics", lambda r: r.numerics, "text", NEUTRAL),
    Field("peak tile memory", lambda r: r.peak_tile_bytes, "bytes"),
    Field("fits", lambda r: "yes" if r.fits else "NO", "text", NEUTRAL),
)

MEMORY: tuple[Field, ...] = (
    Field("budget per tile", lambda r: r.bytes_per_tile, "bytes", NEUTRAL),
    Field("peak tile", lambda r: r.peak_tile_bytes, "bytes"),
    Field("peak, share of budget", m.memory_fraction, "fraction"),
    Field(
        "mean per tile",
        lambda r: int(r.tile_memory.mean()) if r.tile_memory.size else 0,
        "bytes",
    ),
    Field("all tiles", lambda r: _total_memory(r, "total"), "bytes"),
    Field("always-live, all tiles", lambda r: _total_memory(r, "always_live"), "bytes"),
    Field(
        "not-always-live + code, all tiles", lambda r: _total_memory(r, "not_always_live"), "bytes"
    ),
    Field("tiles over budget", lambda r: _total_memory(r, "over_budget_tiles")),
)


def category_fields(a: CostReport, b: CostReport) -> tuple[Field, ...]:
    """The fullest tile's bytes in each category either report has (0 where one lacks it)."""
    names = dict.fromkeys(c.name for r in (a, b) for c in m.categories(r))

    def get(name: str) -> Callable[[CostReport], int]:
        return lambda r: dict(r.fullest_tile_categories).get(name, 0)

    return tuple(Field(name, get(name), "bytes") for name in names)


def _show(value: Any, unit: str) -> str:
    if unit == "bytes":
        return m.fmt_bytes(value)
    if unit == "seconds":
        return m.fmt_seconds(value)
    if unit == "fraction":
        return m.fmt_pct(value)
    if unit == "ghz":
        return f"{value / 1e9:.3f} GHz"
    if unit == "rate":
        return f"{value:,.1f}/s"
    if unit == "int":
        return m.fmt_int(value)
    return str(value)


def _style(delta: float, better: str) -> str:
    if not delta or better == NEUTRAL:
        return ""
    improved = delta < 0 if better == LOWER else delta > 0
    return "green" if improved else "red"


def deltas(a: Any, b: Any, unit: str) -> tuple[str, str]:
    """(absolute, relative) change from a to b, as printed."""
    if unit == "text":
        return ("=" if a == b else "changed", "")
    if unit == "seconds":
        delta = b - a
        absolute = "0" if not delta else ("+" if delta > 0 else "-") + m.fmt_seconds(abs(delta))
        return absolute, m.fmt_delta(a, b)[1]
    if unit == "fraction":
        return (f"{100 * (b - a):+.2f} pp" if b != a else "0"), m.fmt_delta(a, b)[1]
    if unit == "ghz":
        return (f"{(b - a) / 1e9:+.3f} GHz" if b != a else "0"), m.fmt_delta(a, b)[1]
    if unit == "rate":
        return (f"{b - a:+,.1f}/s" if b != a else "0"), m.fmt_delta(a, b)[1]
    return m.fmt_delta(int(a), int(b), as_bytes=unit == "bytes")


def _compare_table(
    title: str, fields: tuple[Field, ...], a: CostReport, b: CostReport, names: tuple[str, str]
) -> Table:
    table = _table(title, "", names[0], names[1], "Δ", "Δ %")
    for field in fields:
        va, vb = field.get(a), field.get(b)
        absolute, relative = deltas(va, vb, field.unit)
        numeric = field.unit != "text"
        style = _style(vb - va, field.better) if numeric else ("yellow" if va != vb else "")
        table.add_row(
            Text(field.label, style="cyan"),
            _show(va, field.unit),
            _show(vb, field.unit),
            Text(absolute, style=style),
            Text(relative, style=style),
        )
    return table


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD)
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 else "right", overflow="fold")
    return table


def ops_table(a: CostReport, b: CostReport, names: tuple[str, str], top: int = TOP_OPS) -> Table:
    cycles_a = dict(a.cycles_by_op())
    cycles_b = dict(b.cycles_by_op())
    ops = sorted(
        set(cycles_a) | set(cycles_b),
        key=lambda op: (-max(cycles_a.get(op, 0), cycles_b.get(op, 0)), op),
    )
    table = _table("Cycles by op", "op", names[0], names[1], "Δ", "Δ %")

    def add(label: str | Text, va: int, vb: int) -> None:
        absolute, relative = m.fmt_delta(va, vb)
        style = _style(vb - va, LOWER)
        table.add_row(
            label,
            m.fmt_int(va),
            m.fmt_int(vb),
            Text(absolute, style=style),
            Text(relative, style=style),
        )

    for op in ops[:top]:
        add(op, cycles_a.get(op, 0), cycles_b.get(op, 0))
    rest = ops[top:]
    if rest:
        add(
            Text(f"... {len(rest)} more ops", style="dim"),
            sum(cycles_a.get(op, 0) for op in rest),
            sum(cycles_b.get(op, 0) for op in rest),
        )
    table.add_section()
    add(Text("total", style="bold"), a.total_cycles, b.total_cycles)
    return table


def diff_renderables(
    a: CostReport, b: CostReport, name_a: str = "A", name_b: str = "B"
) -> list[RenderableType]:
    if name_a == name_b:
        name_a, name_b = f"A: {name_a}", f"B: {name_b}"
    names = (name_a, name_b)
    return [
        Text.assemble(
            ("Comparing ", "bold"),
            (name_a, "bold cyan"),
            (" (A) with ", "bold"),
            (name_b, "bold cyan"),
            (" (B); Δ = B - A, Δ % relative to A", "bold"),
        ),
        _compare_table("Summary", SUMMARY, a, b, names),
        ops_table(a, b, names),
        _compare_table("Memory", MEMORY, a, b, names),
        _compare_table("Memory by category, fullest tile", category_fields(a, b), a, b, names),
    ]


def render_diff(console: Console, a: CostReport, b: CostReport, name_a: str, name_b: str) -> None:
    for renderable in diff_renderables(a, b, name_a, name_b):
        console.print(renderable)
        console.print()

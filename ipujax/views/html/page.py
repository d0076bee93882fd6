"""The page: the summary, communication and phases sections, the navigation bar, and
`render_html`, which puts them together with the memory and execution sections."""

from __future__ import annotations

from ipujax.report import CostReport
from ipujax.views import metrics as m
from ipujax.views.html.execution import execution_section, phase_timeline
from ipujax.views.html.memory import memory_section
from ipujax.views.html.pipeline import pipeline_section
from ipujax.views.html.style import CSS
from ipujax.views.html.trust import range_note, trust_panel
from ipujax.views.html.widgets import card, details, e, panel, table

MAX_ROWS = 500  # rows of a collectives table; a program can need tens of thousands
NONE = '<p class="none">none</p>'


def _summary(report: CostReport) -> str:
    cards = "".join(_cards(report))
    return f'<div class="cards">{cards}</div><div class="panel">{_facts(report)}</div>' + panel(
        "How far to trust the time", trust_panel(report)
    )


def _cards(report: CostReport) -> list[str]:
    """The headline figures, one card each."""
    balance = m.tile_balance(report)
    fits = report.fits
    return [
        card(
            "time per step",
            m.fmt_seconds(report.seconds),
            f"{report.total_cycles:,} cycles; {range_note(report)}",
        ),
        card(
            "FLOP utilisation",
            m.fmt_pct(report.flop_utilisation),
            f"{report.system_flops:,} FLOPs of {m.peak_flops_per_second(report) / 1e12:,.1f} "
            "TFLOP/s",
        ),
        card(
            "peak tile memory",
            m.fmt_bytes_short(report.peak_tile_bytes),
            f"{m.fmt_pct(m.memory_fraction(report), 1)} of "
            f"{m.fmt_bytes_short(report.bytes_per_tile)}",
            "" if fits else "bad",
        ),
        card(
            "fits",
            "yes" if fits else "NO",
            "every tile within budget" if fits else "some tile is over budget",
            "good" if fits else "bad",
        ),
        card("tile balance", m.fmt_pct(balance, 1), "compute-weighted tiles in use"),
        card("supersteps", f"{len(report.supersteps):,}", f"{report.ipus} IPU(s)"),
    ]


def _facts(report: CostReport) -> str:
    """The target and the step's figures as a key-value table."""
    fits = report.fits
    rows = [
        ("target", f"{report.target} ({report.system})"),
        ("IPUs", f"{report.ipus:,}"),
        ("tiles", f"{report.tiles_per_ipu:,} per IPU, {m.fmt_bytes(report.bytes_per_tile)} each"),
        ("clock", f"{report.clock_hz / 1e9:.3f} GHz"),
        ("total cycles", f"{report.total_cycles:,}"),
        ("time per step", m.fmt_seconds(report.seconds)),
        ("FLOPs", f"{report.flops:,} per IPU, {report.system_flops:,} in all"),
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
    return table(
        ("", ""),
        rows,
        row_classes=["over" if k == "fits" and not fits else "" for k, _ in rows],
        cls="kv",
    )


def _communication(report: CostReport) -> str:
    kinds = m.kind_totals(report)
    rows = [
        ("on-chip exchange", f"{m.fmt_bytes(report.exchange_bytes)} in {kinds.exchange:,} cycles"),
        ("IPU-Links", m.fmt_bytes(report.ipu_link_bytes)),
        ("streaming memory", m.fmt_bytes(report.streaming_bytes)),
        ("host", f"{m.fmt_bytes(report.host_bytes)} in {kinds.host:,} cycles not hidden"),
    ]
    overview = table(("traffic", "bytes"), rows)
    if not report.collectives:
        return panel("Traffic", overview) + panel("Collectives (IPU-Link bytes)", NONE)
    groups = m.collective_groups(report)
    title = (
        f"Collectives (IPU-Link bytes): {len(report.collectives):,} in {len(groups):,} groups "
        "by kind, axes and source line"
    )
    return panel("Traffic", overview) + panel(
        title, _collective_groups(groups) + _every_collective(report)
    )


def _collective_groups(groups: list[m.CollectiveGroup]) -> str:
    """The groups as the terminal's default table has them, costliest first; past
    `MAX_ROWS` the rest summed in one row."""
    rows: list[tuple[object, ...]] = [
        (
            g.kind,
            ",".join(g.axes),
            g.group_size,
            m.short_source(g.source) if g.source else "",
            f"{g.count:,}",
            f"{g.bytes_per_ipu:,}",
            f"{g.cycles:,}",
        )
        for g in groups[:MAX_ROWS]
    ]
    rest = groups[MAX_ROWS:]
    if rest:
        counts = (sum(g.count for g in rest), sum(g.bytes_per_ipu for g in rest))
        cycles = sum(g.cycles for g in rest)
        rows.append(
            (f"... {len(rest):,} more", "", "", "", *(f"{n:,}" for n in counts), f"{cycles:,}")
        )
    return table(
        ("kind", "axes", "group", "source", "count", "bytes per IPU", "cycles"),
        rows,
        numeric=(2, 4, 5, 6),
        source=(3,),
    )


def _every_collective(report: CostReport) -> str:
    """Each collective with the op and why it was needed, folded away: a large program has
    thousands. At most `MAX_ROWS` rows; the JSON report holds every one."""
    shown = report.collectives[:MAX_ROWS]
    listing = table(
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
                m.shorten_paths(c.why),
            )
            for c in shown
        ],
        numeric=(2, 3, 4),
        source=(6,),
        prose=(7,),
    )
    more = len(report.collectives) - len(shown)
    note = f'<p class="note">{more:,} more not listed (the JSON report has every one).</p>'
    summary = f"Every collective, with why it was needed ({len(report.collectives):,})"
    return details(summary, listing + (note if more else ""))


def _phases(report: CostReport) -> str:
    if not report.phases:
        return panel("Phases", '<p class="none">none (phases=None)</p>')
    listing = table(
        m.PHASE_COLUMNS,
        [(p.name, *(f"{n:,}" for n in m.phase_figures(p))) for p in report.phases],
        numeric=tuple(range(1, len(m.PHASE_COLUMNS))),
        row_classes=[
            "over" if p.peak_tile_bytes > report.bytes_per_tile else "" for p in report.phases
        ],
    )
    note = (
        "Bytes per IPU. Streaming is the IO window before a phase (its loads and gathers, the "
        "previous phase's stores); with IO tiles it runs during the previous phase's compute "
        "and only the exposed part adds to the step."
    )
    return panel("Phase timeline", phase_timeline(report)) + panel("Phases", listing, note)


def _nav() -> str:
    links = "".join(
        f'<a href="#{anchor}">{name}</a>'
        for anchor, name in (
            ("summary", "Summary"),
            ("memory", "Memory"),
            ("execution", "Execution"),
            ("communication", "Communication"),
            ("phases", "Phases"),
            ("pipeline", "Pipeline"),
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
        f'<h1>{e(heading)}</h1><p class="sub">{e(subtitle)}</p>'
        f"{_nav()}"
        f'<h2 id="summary">Summary</h2>{_summary(report)}'
        f'<h2 id="memory">Memory</h2>{memory_section(report)}'
        f'<h2 id="execution">Execution</h2>{execution_section(report)}'
        f'<h2 id="communication">Communication</h2>{_communication(report)}'
        f'<h2 id="phases">Phases</h2>{_phases(report)}'
        f'<h2 id="pipeline">Pipeline</h2>{pipeline_section(report)}'
        "<footer>Generated by ipujax from the cost model (no measurement). Definitions: "
        "docs/cli.md.</footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(heading)}</title><style>{CSS}</style></head>"
        f"<body><main>{body}</main></body></html>\n"
    )

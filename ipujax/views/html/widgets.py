"""The small HTML pieces every section uses: escaping, tables, panels, cards and colour legends,
and the plot width they share."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape

WIDTH = 1100  # plot width in px; the page is 1180 px wide at most


def e(text: object) -> str:
    return escape(str(text), quote=True)


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[object]],
    numeric: Sequence[int] = (),
    source: Sequence[int] = (),
    row_classes: Sequence[str] | None = None,
    cls: str = "",
    prose: Sequence[int] = (),
) -> str:
    """A table in its own horizontally scrolling box, so that a wide one (long source lines,
    a collective's why) scrolls inside its panel instead of running past it. `numeric` columns
    align right; `source` ones are monospace and `prose` ones plain text, both wrapping
    anywhere when a path has no space to break at."""
    head = "".join(
        f'<th class="num">{e(h)}</th>' if i in numeric else f"<th>{e(h)}</th>"
        for i, h in enumerate(headers)
    )
    body = []
    for r, row in enumerate(rows):
        cells = []
        for i, cell in enumerate(row):
            kind = (
                "num" if i in numeric else "src" if i in source else "prose" if i in prose else ""
            )
            raw = cell if isinstance(cell, Raw) else e(cell)
            cells.append(f'<td class="{kind}">{raw}</td>' if kind else f"<td>{raw}</td>")
        marked = row_classes[r] if row_classes and row_classes[r] else ""
        body.append(f'<tr class="{marked}">' if marked else "<tr>")
        body.append("".join(cells) + "</tr>")
    thead = f"<thead><tr>{head}</tr></thead>" if any(headers) else ""
    opening = f'<table class="{cls}">' if cls else "<table>"
    return f'<div class="scroll">{opening}{thead}<tbody>{"".join(body)}</tbody></table></div>'


def svg(width: int, height: int, label: str, body: str) -> str:
    """An inline SVG plot of `width` x `height` px, `label` for screen readers."""
    return (
        f'<svg width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{label}">{body}</svg>'
    )


class Raw(str):
    """Markup this package built itself (already escaped)."""


def panel(title: str, content: str, note: str = "") -> str:
    note_html = f'<p class="note">{e(note)}</p>' if note else ""
    return f'<div class="panel"><h3>{e(title)}</h3>{content}{note_html}</div>'


def details(summary: str, content: str) -> str:
    """`content` folded away under a `summary` line the reader opens (no script needed)."""
    return f"<details><summary>{e(summary)}</summary>{content}</details>"


def card(key: str, value: str, note: str = "", cls: str = "") -> str:
    return (
        f'<div class="card {cls}"><div class="k">{e(key)}</div><div class="v">{e(value)}</div>'
        f'<div class="n">{e(note)}</div></div>'
    )


def legend(items: Sequence[tuple[str, str]]) -> str:
    spans = "".join(f'<span><i style="background:{c}"></i>{e(n)}</span>' for n, c in items)
    return f'<div class="legend">{spans}</div>'


def segment(
    x: float, y: float, w: float, h: float, colour: str, tip: str, outline: bool = False
) -> str:
    """A timeline's box with its tooltip; nothing when it has no width. Outlined boxes (many
    side by side) are drawn at least half a pixel wide."""
    if w <= 0:
        return ""
    if outline:
        w = max(w, 0.5)
    edge = ' stroke="white" stroke-width="0.3"' if outline else ""
    return (
        f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{h}" fill="{colour}"{edge}>'
        f"<title>{e(tip)}</title></rect>"
    )

"""The HTML report's layout on small hand-made reports: wide tables scroll inside their panel,
the collectives are grouped by kind, axes and source line as in the terminal (every one folded
away below, capped), and the tile heatmap keeps a gradient past the memory budget."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

import numpy as np

from ipujax.report import CollectiveCost, CostReport, SuperstepCost
from ipujax.views.html import render_html
from ipujax.views.html.page import MAX_ROWS
from ipujax.views.html.style import CSS

BUDGET = 1000
LONG = "/somewhere/else/a/long/folder/without/spaces/to/break/at/model_definitions.py"


def report(tile_memory: list[int], collectives: tuple[CollectiveCost, ...] = ()) -> CostReport:
    """One IPU of len(tile_memory) tiles, one superstep, `BUDGET` bytes per tile."""
    step = SuperstepCost("add", "add", f"{LONG}:3", 4, 40, 0, 100, 0, 90)
    return CostReport(
        target="bow",
        system="single IPU",
        ipus=1,
        tiles_per_ipu=len(tile_memory),
        clock_hz=1e9,
        bytes_per_tile=BUDGET,
        total_cycles=step.cycles,
        flops=40,
        peak_flops_per_cycle=32,
        exchange_bytes=0,
        ipu_link_bytes=0,
        streaming_bytes=0,
        tile_memory=np.array([tile_memory]),
        always_live=np.zeros((1, len(tile_memory)), int),
        supersteps=(step,),
        collectives=collectives,
    )


def all_reduce(line: int, nbytes: int = 4096) -> CollectiveCost:
    why = f"operand 0 of add at {LONG}:{line} (elementwise rule); over IPU-Links within a machine"
    return CollectiveCost(
        "all_reduce", ("dp",), 2, nbytes, 1000, "all_reduce(dp)", f"{LONG}:{line}", why
    )


# ---- the page's tables, as the browser nests them -------------------------------------------

VOID = {"meta", "link", "br", "hr", "img", "input"}


@dataclass
class Table:
    wrappers: list[str]  # the classes of the elements around it, outermost first
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    cell_classes: list[list[str]] = field(default_factory=list)


class Tables(HTMLParser):
    """Every table of a page: its headers, cells and what encloses it (panel, scroll, details)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []  # "tag.class" of every open non-table element
        self.tables: list[Table] = []
        self.current: Table | None = None
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        cls = dict(attrs).get("class") or ""
        if tag == "table":
            self.current = Table(wrappers=list(self.open))
            self.tables.append(self.current)
        elif self.current is None and tag not in VOID:
            self.open.append(f"{tag}.{cls}")
        elif tag == "tr":
            self.current.rows.append([])
            self.current.cell_classes.append([])
        elif tag in ("td", "th"):
            self.cell = []
            if tag == "td":
                self.current.cell_classes[-1].append(cls)

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self.current = None
        elif self.current is None:
            if self.open and self.open[-1].startswith(f"{tag}."):
                self.open.pop()
        elif tag in ("td", "th") and self.cell is not None:
            text = "".join(self.cell).strip()
            if tag == "th":
                self.current.headers.append(text)
                self.current.rows.pop()  # the header row is no body row
                self.current.rows.append([])
            else:
                self.current.rows[-1].append(text)
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def tables(page: str) -> list[Table]:
    parser = Tables()
    parser.feed(page)
    parser.close()
    for t in parser.tables:  # drop the empty row the header left behind
        t.rows = [r for r in t.rows if r]
        t.cell_classes = [c for c in t.cell_classes if c]
    return parser.tables


def collective_tables(page: str) -> tuple[Table, Table]:
    """The grouped collectives table and the full list after it."""
    found = [t for t in tables(page) if t.headers[:2] == ["kind", "axes"]]
    assert len(found) == 2, [t.headers for t in found]
    return found[0], found[1]


# ---- tests ---------------------------------------------------------------------------------


def test_every_table_scrolls_inside_its_panel_and_long_cells_wrap() -> None:
    page = render_html(report([100, 200], (all_reduce(1),)))
    for t in tables(page):
        assert t.wrappers[-1] == "div.scroll", t.headers
    assert re.search(r"\.scroll \{[^}]*overflow-x: auto", CSS)
    assert re.search(r"td\.src, td\.prose \{[^}]*overflow-wrap: anywhere", CSS)
    _, every = collective_tables(page)
    assert every.cell_classes[0][-2:] == ["src", "prose"]  # source, why


def test_collectives_are_grouped_by_kind_axes_and_source_line() -> None:
    collectives = tuple(all_reduce(line) for line in (1, 1, 1, 2, 2, 3, 4))
    page = render_html(report([100, 200], collectives))
    assert "Collectives (IPU-Link bytes): 7 in 4 groups" in page
    grouped, every = collective_tables(page)
    assert grouped.headers[:4] == ["kind", "axes", "group", "source"]
    assert grouped.headers[4:] == ["count", "bytes per IPU", "cycles"]
    assert [row[4] for row in grouped.rows] == ["3", "2", "1", "1"]  # costliest first
    assert grouped.rows[0][:4] == ["all_reduce", "dp", "2", f"{LONG}:1"]
    assert grouped.rows[0][5:] == ["12,288", "3,000"]
    assert "details." in every.wrappers[-2]  # every collective, folded away
    assert len(every.rows) == 7 and every.headers[-1] == "why"


def test_thousands_of_collectives_are_capped_with_the_rest_counted() -> None:
    more = 37
    collectives = tuple(all_reduce(line) for line in range(MAX_ROWS + more))
    page = render_html(report([100, 200], collectives))
    grouped, every = collective_tables(page)
    assert len(grouped.rows) == MAX_ROWS + 1
    assert grouped.rows[-1][0] == f"... {more} more"
    assert grouped.rows[-1][4] == f"{more}"  # the count of the collectives summed in that row
    assert len(every.rows) == MAX_ROWS
    assert f"{more} more not listed" in page


# ---- the heatmap past the budget --------------------------------------------------------------


def fills(page: str) -> dict[int, str]:
    """Each tile's colour in the heatmap of IPU 0."""
    found = re.findall(r'fill="(#[0-9a-f]{6})"><title>IPU 0 tile (\d+):', page)
    return {int(tile): colour for colour, tile in found}


def test_tiles_over_the_budget_keep_a_gradient() -> None:
    over = [int(BUDGET * share) for share in (1.01, 1.9, 1.5, 1.2)]  # every tile over
    colour = fills(render_html(report(over)))
    assert len(set(colour.values())) == 4  # 101% and 190% look different, as do the rest
    assert colour[1] == "#d62728"  # the fullest tile is the red of "over the budget"


def test_the_two_gradients_meet_at_the_budget_and_the_legend_says_so() -> None:
    page = render_html(report([100, 900, 1000, 1010, 1900]))
    colour = fills(page)
    within, past = {colour[0], colour[1], colour[2]}, {colour[3], colour[4]}
    assert len(within) == 3 and len(past) == 2 and not within & past
    assert colour[2] == "#fde725"  # the budget itself: the top of the within-budget palette
    assert "budget 1000 B" in page  # marked where the over-budget bar starts
    assert "reds are over the budget of 1000 B per tile (the fullest is 190.0% of it)" in page

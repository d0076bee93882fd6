"""The pieces every terminal table uses: a titled table whose figures stay whole and whose names
and sources stay on one line, a two-column key-value table, and the row limits they share."""

from __future__ import annotations

from rich import box
from rich.table import Table

TOP_ROWS = 15  # rows of the by-op table before the rest are summed
SHORT_ROWS = 10  # the same, and collective groups, in the default (one screen) summary
_ONE_LINE = {"op": 14, "source": 24, "kind": 16, "axes": 12}  # column: its widest


def titled_table(title: str, *columns: str, numeric: tuple[int, ...] = ()) -> Table:
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


def tail(source: str) -> str:
    """A source cut from the left to fit its one-line column, keeping its file and line."""
    width = _ONE_LINE["source"]
    return source if len(source) <= width else "…" + source[len(source) - width + 1 :]


def whole_numbers(table: Table) -> Table:
    """Numeric columns at least as wide as their widest cell: when the table is wider than the
    console, Rich cuts the names and sources, never the figures."""
    for column in table.columns:
        if column.justify == "right":
            column.min_width = max((len(str(c)) for c in column.cells), default=0)
    return table


def key_values(title: str) -> Table:
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

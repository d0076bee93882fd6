"""The `ipujax fidelity` table: each published figure, ipujax's value for it, and their ratio."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from ipujax.fidelity import HIGH, LOW, Row, error_summary, number, ratio_text
from ipujax.fidelity_ranking import ranking_summary


def render_fidelity(console: Any, rows: Sequence[Row]) -> None:
    title = f"ipujax against published figures (band {LOW}-{HIGH} unless a row says otherwise)"
    table = Table(title=title, show_lines=False)
    table.add_column("figure")
    table.add_column("published", justify="right")
    table.add_column("ipujax", justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("ipujax reads")
    for row in rows:
        f = row.figure
        ratio = ratio_text(row)
        ratio = ratio if row.within else f"[red]{ratio} (outside)[/red]"
        table.add_row(
            f.name,
            f"{number(f.published)} {f.unit}",
            f"{number(row.ipujax)} {f.unit}",
            ratio,
            f.what,
        )
    console.print(table)
    console.print("Sources:")
    for i, row in enumerate(rows, 1):
        console.print(f"  {i}. {row.figure.name}: {row.figure.source}")
    derived = [row for row in rows if row.derivation]
    if derived:
        console.print("Derivations:")
    for row in derived:
        console.print(f"  {row.figure.name}: {row.derivation}")
    console.print(ranking_summary(rows))
    console.print(error_summary(rows))  # the last line: the mean and maximum |error|

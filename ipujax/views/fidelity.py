"""The `ipujax fidelity` table: each published figure, ipujax's value for it, and their ratio."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from ipujax.fidelity import HIGH, LOW, Row, number


def render_fidelity(console: Any, rows: Sequence[Row]) -> None:
    table = Table(title=f"ipujax against published figures (band {LOW}-{HIGH})", show_lines=False)
    table.add_column("figure")
    table.add_column("published", justify="right")
    table.add_column("ipujax", justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("ipujax reads")
    for row in rows:
        f = row.figure
        ratio = f"{row.ratio:.2f}" if row.within else f"[red]{row.ratio:.2f} (outside)[/red]"
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

"""The `ipujax what-if` tables: the step's time by kind before and after a change of the
machine, and its elasticity to each main parameter."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table

from ipujax.report import CostReport
from ipujax.what_if import PARAMETERS


def _ratio(before: float, after: float) -> str:
    """How much faster the change makes it, or slower (never "0.84x faster")."""
    if not after or not before:
        return "-"
    if after > before:
        return f"{after / before:.2f}x slower"
    return f"{before / after:.2f}x faster"


def render_what_if(
    console: Any, before: CostReport, after: CostReport, changes: Mapping[str, Any]
) -> None:
    said = ", ".join(f"{k}={v}" for k, v in changes.items())
    table = Table(title=f"What if {said}")
    for name in ("time (ms)", "as it is", "changed", "before / after"):
        table.add_column(name, justify="left" if name == "time (ms)" else "right")
    now, then = before.time_split(), after.time_split()
    for kind, seconds in now.items():
        table.add_row(
            kind, f"{seconds * 1e3:.4f}", f"{then[kind] * 1e3:.4f}", _ratio(seconds, then[kind])
        )
    table.add_row(
        "step",
        f"{before.seconds * 1e3:.4f}",
        f"{after.seconds * 1e3:.4f}",
        _ratio(before.seconds, after.seconds),
        end_section=True,
    )
    table.add_row("fits", "yes" if before.fits else "NO", "yes" if after.fits else "NO", "")
    console.print(table)


def render_sensitivity(console: Any, elasticity: Mapping[str, float]) -> None:
    table = Table(title="Sensitivity: d ln(step time) / d ln(parameter), each doubled")
    for name in ("parameter", "Target fields", "elasticity"):
        table.add_column(name, justify="right" if name == "elasticity" else "left")
    for kind, value in elasticity.items():
        table.add_row(kind, ", ".join(PARAMETERS[kind]), f"{value:+.2f}")
    console.print(table)

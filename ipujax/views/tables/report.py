"""The cost report as rich tables for a terminal: summary, memory, execution, communication,
phases, pipeline. `render(console, report)` prints them all; each module's `*_tables` function
returns renderables so that other views can reuse them."""

from __future__ import annotations

from rich.console import Console, Group, RenderableType

from ipujax.report import CostReport
from ipujax.views.tables.communication import communication_tables
from ipujax.views.tables.execution import execution_tables
from ipujax.views.tables.memory import memory_tables
from ipujax.views.tables.phases import phases_tables, pipeline_tables
from ipujax.views.tables.summary import summary_table


def report_renderables(report: CostReport, full: bool = True) -> list[RenderableType]:
    """Every table; with `full=False` the ones that fit a screen: the memory's peak and
    categories, the costliest ops, collectives grouped by kind, axes and source line."""
    return [
        summary_table(report),
        *memory_tables(report, full),
        *execution_tables(report, full),
        *communication_tables(report, full),
        *phases_tables(report),
        *pipeline_tables(report),
    ]


def render(console: Console, report: CostReport, full: bool = True) -> None:
    for renderable in report_renderables(report, full):
        console.print(renderable)
        console.print()


def as_group(report: CostReport, full: bool = True) -> Group:
    return Group(*report_renderables(report, full))

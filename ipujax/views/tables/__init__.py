"""The cost report as rich tables for a terminal, one module per section: `summary`, `memory`,
`execution`, `communication` (and the collectives), `phases` (and the pipeline's stages), on the
pieces of `widgets`; `report` puts them together (`render`, `report_renderables`)."""

from ipujax.views.tables.report import as_group, render, report_renderables

__all__ = ["as_group", "render", "report_renderables"]

"""The cost report as one self-contained HTML page: tables and inline SVG plots (memory per tile
as a heatmap and a profile against the budget, cycles by op, the superstep timeline).

No scripts, no external CSS, fonts or images: the page opens from a file anywhere. Every piece of
text from the report is escaped.

`page` assembles the page from the sections in `memory` and `execution`; `widgets` holds the
small HTML pieces they share and `style` the style sheet.
"""

from ipujax.views.html.page import render_html

__all__ = ["render_html"]

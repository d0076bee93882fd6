"""The page's style sheet, inlined in its <style> element: no external CSS or fonts."""

CSS = """
* { box-sizing: border-box; }
body { margin: 0; background: #f4f5f7; color: #1d2330;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 24px 48px; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 32px 0 12px; padding-bottom: 4px; border-bottom: 2px solid #d8dce3; }
h3 { font-size: 15px; margin: 20px 0 8px; color: #3a4252; }
.sub { color: #5b6475; margin: 0 0 16px; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 10px; }
.card { background: #fff; border: 1px solid #dde1e7; border-radius: 8px; padding: 10px 14px; }
.card .k { color: #5b6475; font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.card .v { font-size: 20px; font-weight: 600; font-variant-numeric: tabular-nums; }
.card .n { color: #5b6475; font-size: 12px; }
.bad { background: #fdecea; border-color: #f3b4ae; }
.bad .v { color: #b3261e; }
.good .v { color: #1e7b34; }
.panel h3 { margin-top: 2px; }
.panel { background: #fff; border: 1px solid #dde1e7; border-radius: 8px; padding: 12px 16px;
  margin: 0 0 14px; overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 10px; border-bottom: 1px solid #eceef2; text-align: left;
  vertical-align: top; }
th { color: #3a4252; font-weight: 600; background: #f8f9fb; }
td.num, th.num { text-align: right; white-space: nowrap; }
td.src { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12.5px; }
/* A wide table scrolls in its own box; long paths break anywhere rather than widen the table,
   and a column of sentences keeps room enough to read. */
.scroll { overflow-x: auto; max-width: 100%; }
td.src, td.prose { overflow-wrap: anywhere; }
td.src { min-width: 12em; }
td.prose { min-width: 18em; }
details { margin-top: 10px; }
summary { cursor: pointer; color: #2b5d8e; font-weight: 600; }
tr.over td { color: #b3261e; font-weight: 600; }
.bar { display: inline-block; height: 10px; background: #5e9fd8; border-radius: 2px; }
.bar.over { background: #d62728; }
.note { color: #5b6475; font-size: 13px; margin: 6px 0 0; }
.none { color: #5b6475; font-style: italic; }
svg { display: block; max-width: 100%; height: auto; }
svg text { font-family: system-ui, "DejaVu Sans", sans-serif; fill: #3a4252; }
.legend span { display: inline-block; margin-right: 16px; font-size: 13px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 5px;
  vertical-align: -1px; border-radius: 2px; }
nav { position: sticky; top: 0; z-index: 1; background: #f4f5f7ee; padding: 6px 0;
  border-bottom: 1px solid #dde1e7; }
nav a { color: #2b5d8e; text-decoration: none; margin-right: 18px; font-weight: 600; }
table.kv td:first-child { width: 190px; color: #3a4252; font-weight: 600; }
footer { color: #7a8394; font-size: 12px; margin-top: 36px; }
"""

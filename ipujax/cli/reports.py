"""`ipujax report show PATH.json` and `ipujax report diff A.json B.json`: a saved cost report
printed as the same tables (and written as a trace or a page), or two compared side by side."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ipujax.cli.output import add_outputs, open_console, read_report, show_report


def add_report(commands: Any) -> None:
    report = commands.add_parser(
        "report", help="show or compare saved cost reports", description="Saved cost reports."
    )
    actions = report.add_subparsers(dest="action", metavar="ACTION", required=True)
    _add_show(actions)
    _add_diff(actions)


def _add_show(actions: Any) -> None:
    show = actions.add_parser("show", help="print a saved report (JSON) as tables")
    show.add_argument("path", metavar="PATH.json")
    add_outputs(show, json_flag=False)
    show.set_defaults(run=run_show)


def _add_diff(actions: Any) -> None:
    diff = actions.add_parser("diff", help="compare two saved reports side by side")
    diff.add_argument("a", metavar="A.json")
    diff.add_argument("b", metavar="B.json")
    diff.set_defaults(run=run_diff)


def run_show(args: argparse.Namespace) -> int:
    show_report(read_report(args.path), args)
    return 0


def run_diff(args: argparse.Namespace) -> int:
    from ipujax.views.diff import render_diff

    a, b = read_report(args.a), read_report(args.b)
    render_diff(open_console(), a, b, Path(args.a).name, Path(args.b).name)
    return 0

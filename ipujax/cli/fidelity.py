"""`ipujax fidelity`: the cost model against every published IPU figure it knows, as a table
(and docs/fidelity.md with `--markdown`); exit code 1 when a ratio is out of bounds."""

from __future__ import annotations

import argparse
from typing import Any

from ipujax.cli.errors import CliError
from ipujax.cli.output import open_console, write
from ipujax.fidelity import HIGH, LOW


def add_fidelity(commands: Any) -> None:
    fidelity = commands.add_parser(
        "fidelity",
        help="compare the cost model with every published figure it knows",
        description="Compile each program behind a published IPU figure, read the same "
        "quantity from its cost report, and print published, ipujax and their ratio; exits "
        f"with 1 if any ratio is outside {LOW}-{HIGH}.",
    )
    fidelity.add_argument("--only", metavar="TEXT", help="only the figures whose name has TEXT")
    fidelity.add_argument(
        "--markdown", metavar="PATH", help="write the table as docs/fidelity.md holds it"
    )
    fidelity.set_defaults(run=run_fidelity)


def run_fidelity(args: argparse.Namespace) -> int:
    from ipujax import fidelity
    from ipujax.views.fidelity import render_fidelity

    figures = [f for f in fidelity.FIGURES if (args.only or "").lower() in f.name.lower()]
    if not figures:
        names = "; ".join(f.name for f in fidelity.FIGURES)
        raise CliError(f"--only {args.only!r} matches no figure; the figures are: {names}")
    rows = fidelity.run(figures)
    console = open_console()
    render_fidelity(console, rows)
    if args.markdown:
        write("the table", args.markdown, fidelity.document(rows), console)
    return 0 if all(row.within for row in rows) else 1

"""The program: `build_parser`, which gathers every command's parser, and `main`, which runs the
command asked for and turns a user error into one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ipujax.cli.cost_report import add_cost_report
from ipujax.cli.errors import EXIT_ERROR, CliError, CliParser, one_line
from ipujax.cli.fidelity import add_fidelity
from ipujax.cli.output import check_outputs
from ipujax.cli.plan import add_plan
from ipujax.cli.reports import add_report
from ipujax.cli.version import add_version
from ipujax.cli.what_if import add_what_if
from ipujax.errors import IpujaxError


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog="ipujax",
        description="Compile JAX programs for a virtual Graphcore IPU and report their cost.",
        epilog="See docs/cli.md for what each table means.",
    )
    add_version(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_cost_report(commands)
    add_report(commands)
    add_fidelity(commands)
    add_plan(commands)
    add_what_if(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as done:  # --help, --version
            return done.code if isinstance(done.code, int) else 0
        if args.command is None:
            parser.print_help()
            return 0
        check_outputs(args)
        return int(args.run(args))
    except (CliError, IpujaxError) as error:
        print(f"ipujax: error: {one_line(error)}", file=sys.stderr)
        return EXIT_ERROR

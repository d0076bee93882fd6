"""`ipujax what-if SPEC --set NAME=VALUE ...`: SPEC's workload on the machine as it is and as
changed, the step's time by kind side by side; `--sensitivity` adds the step's elasticity to
each main parameter of the machine."""

from __future__ import annotations

import argparse
from typing import Any

from ipujax.api import jit
from ipujax.cli.cost_report import add_workload_flags, workload_for
from ipujax.cli.errors import CliError
from ipujax.cli.output import open_console
from ipujax.views.what_if import render_sensitivity, render_what_if

_HELP = "cost a workload on a changed machine, or its sensitivity to the machine"
_DESCRIPTION = (
    "Compile SPEC's workload, then build it again on the Target with each --set change (a "
    "field's value, or a factor such as 2x), and print the step's time by kind before and "
    "after; --sensitivity doubles each main rate in turn."
)


def add_what_if(commands: Any) -> None:
    what = commands.add_parser("what-if", help=_HELP, description=_DESCRIPTION)
    add_workload_flags(what)
    what.add_argument(
        "--set",
        dest="changes",
        action="append",
        default=[],
        metavar="NAME=VALUE|NAME=2x",
        help="a Target field and its new value or factor, e.g. ipu_link_bytes_per_second=2x",
    )
    what.add_argument(
        "--sensitivity",
        action="store_true",
        help="the step's elasticity to clock, exchange, links, streaming, host and memory",
    )
    what.set_defaults(run=run_what_if)


def parse_changes(texts: list[str]) -> dict[str, str]:
    """'NAME=VALUE' flags as {NAME: VALUE}."""
    changes = {}
    for text in texts:
        name, sep, value = text.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise CliError(f"--set {text!r}: expected NAME=VALUE or NAME=2x")
        changes[name.strip()] = value.strip()
    return changes


def run_what_if(args: argparse.Namespace) -> int:
    changes = parse_changes(args.changes)
    if not changes and not args.sensitivity:
        raise CliError("what-if needs --set NAME=VALUE (or NAME=2x), --sensitivity, or both")
    workload = workload_for(args)
    lowered = jit(workload.fun, **workload.jit_kwargs).lower(*workload.args)
    compiled = lowered.compile(check_memory_fits=False)
    console = open_console()
    before = compiled.cost_report()
    if changes:
        render_what_if(console, before, compiled.what_if(**changes), changes)
    if args.sensitivity:
        render_sensitivity(console, compiled.sensitivity())
    return 0

"""`ipujax cost-report SPEC`: compile SPEC's workload on the mesh and IPU the flags name and
print its cost report (and write it as JSON, a trace, a page)."""

from __future__ import annotations

import argparse
from typing import Any

from ipujax.api import jit
from ipujax.cli.flags import (
    add_target,
    mesh_from_flags,
    parse_mesh,
    parse_phases,
    parse_resident,
    parse_target,
)
from ipujax.cli.output import add_outputs, show_report
from ipujax.cli.spec import Workload, accepts_mesh, call_workload, load_spec, mesh_refusals
from ipujax.latency import checked_iterations
from ipujax.report import CostReport
from partitioner import Mesh


def add_cost_report(commands: Any) -> None:
    cost = commands.add_parser(
        "cost-report",
        help="compile a workload and print its cost report",
        description="Compile SPEC's workload for a virtual IPU and print its cost report.",
    )
    add_workload_flags(cost)
    add_outputs(cost, json_flag=True)
    cost.set_defaults(run=run_cost_report)


def add_workload_flags(parser: Any) -> None:
    """SPEC and the flags that say how to compile its workload: the IPU, the mesh, phases and
    the arguments that stay on the IPUs."""
    parser.add_argument(
        "spec",
        metavar="SPEC",
        help="path/to/file.py:NAME or package.module:NAME; NAME() returns (fun, args) or "
        "(fun, args, jit_kwargs), and gets mesh= when it takes a mesh keyword",
    )
    add_target(parser)
    parser.add_argument(
        "--mesh", metavar="AXIS=N,...", help="mesh axes, e.g. dp=2,tp=8 (default: ipu=1)"
    )
    parser.add_argument(
        "--phases", metavar="auto|none|NAME,NAME,...", help="phased execution (default: none)"
    )
    parser.add_argument(
        "--resident",
        metavar="ARGNUMS_OR_NAMES",
        help="arguments that stay on the IPUs between calls (weights), by position or name, "
        "e.g. 0 or params: not charged per call over the host link",
    )
    parser.add_argument(
        "--device-iterations",
        metavar="N",
        type=int,
        help="calls whose inputs one host transfer carries, as Poplar's device iterations "
        "(default: 1); the report's latency per call and calls/s follow",
    )


def run_cost_report(args: argparse.Namespace) -> int:
    show_report(compile_report(workload_for(args)), args)
    return 0


def workload_for(args: argparse.Namespace) -> Workload:
    # Bad flags fail before any workload code runs.
    phases = parse_phases(args.phases) if args.phases is not None else None
    resident = parse_resident(args.resident) if args.resident is not None else {}
    iterations = args.device_iterations
    rounds = {} if iterations is None else {"device_iterations": checked_iterations(iterations)}
    if args.target is not None:
        parse_target(args.target)
    if args.mesh is not None:
        parse_mesh(args.mesh)
    factory = load_spec(args.spec)
    if accepts_mesh(factory):
        mesh = mesh_from_flags(args, None)
        with mesh_refusals(args.spec, mesh):
            workload = call_workload(factory, args.spec, mesh)
        workload.jit_kwargs.setdefault("mesh", mesh)
    else:
        workload = call_workload(factory, args.spec, None)
        if args.target is not None or args.mesh is not None:
            given = workload.jit_kwargs.get("mesh")
            base = given if isinstance(given, Mesh) else None
            workload.jit_kwargs["mesh"] = mesh_from_flags(args, base)
    if args.phases is not None:
        workload.jit_kwargs["phases"] = phases
    workload.jit_kwargs.update(resident)
    workload.jit_kwargs.update(rounds)
    return workload


def compile_report(workload: Workload) -> CostReport:
    lowered = jit(workload.fun, **workload.jit_kwargs).lower(*workload.args)
    return lowered.compile(check_memory_fits=False).cost_report()

"""`ipujax plan SPEC --system NAME`: every way to run SPEC's workload on a system's IPUs,
costed and ranked by the plan search (docs/plan.md), printed as a table (and written as JSON)."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ipujax.cli.errors import CliError
from ipujax.cli.flags import add_target, parse_target
from ipujax.cli.output import open_console, write
from ipujax.cli.spec import accepts_mesh, call_workload, load_spec
from ipujax.planning.workers import MAX_JOBS, default_jobs
from partitioner import Mesh

if TYPE_CHECKING:
    from ipujax.planning import Model


def add_plan(commands: Any) -> None:
    planner = commands.add_parser(
        "plan",
        help="search the ways to run a workload on a system and rank them",
        description="Cost every way to run SPEC's workload on all IPUs of a system (replicas, "
        "1D/2D tensor parallelism, pipeline stages, phases, recomputation), pruned by memory "
        "and cost bounds, and print them ranked: those that fit first, fastest first "
        "(docs/plan.md).",
    )
    planner.add_argument(
        "spec",
        metavar="SPEC",
        help="path/to/file.py:NAME or package.module:NAME; NAME(mesh=...) returns (fun, args, "
        "jit_kwargs) for each mesh tried; a `layers` keyword with an integer default lets the "
        "search cost shallower copies",
    )
    planner.add_argument(
        "--system",
        default="pod16",
        metavar="NAME",
        help="pod16, pod64, pod128, pod256, bow (a Bow-2000), m2000, ipu, or a number of IPUs "
        "(default: pod16)",
    )
    add_target(planner)
    _add_plan_outputs(planner)
    planner.set_defaults(run=run_plan)


def _add_plan_outputs(planner: argparse.ArgumentParser) -> None:
    """The flags of what the search prints and writes, and how far it confirms its best."""
    planner.add_argument("--json", metavar="PATH", help="write the ranked plans as JSON")
    planner.add_argument(
        "--top", type=int, default=10, metavar="N", help="plans to print (default: 10)"
    )
    planner.add_argument(
        "--confirm",
        type=int,
        default=2,
        metavar="N",
        help="extrapolated plans compiled whole before the best is trusted (default: 2)",
    )
    planner.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    planner.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="worker processes costing plans side by side (default: this machine's usable "
        f"cores, at most {MAX_JOBS}; 1: all in this process)",
    )


def run_plan(args: argparse.Namespace) -> int:
    from ipujax import planning
    from ipujax.views.plans import render_plans

    planning.system_ipus(args.system)  # bad flags fail before any workload code runs
    target = parse_target(args.target) if args.target else None
    jobs = _jobs(args.jobs)
    plans = planning.search(
        spec_model(args.spec),
        args.system,
        target,
        confirm=args.confirm,
        progress=None if args.quiet else _progress,
        jobs=jobs,
    )
    console = open_console()
    render_plans(console, plans, args.spec, args.top)
    if args.json:
        write("the ranked plans", args.json, plans.to_json(), console)
    return 0


def spec_model(spec: str) -> Model:
    """The search's model of SPEC's workload, which a worker process makes again from SPEC."""
    from ipujax import planning

    factory = _mesh_factory(spec)

    def call(mesh: Mesh, **extra: Any) -> tuple:
        workload = call_workload(factory, spec, mesh, **extra)
        return workload.fun, workload.args, workload.jit_kwargs

    return planning.workload_model(factory, call, functools.partial(spec_model, spec))


def _jobs(given: int | None) -> int:
    if given is None:
        return default_jobs()
    if given < 1:
        raise CliError(f"--jobs {given}: give 1 or more worker processes")
    return given


def _mesh_factory(spec: str) -> Callable[..., Any]:
    """The spec's callable, which must take a mesh keyword: the search builds one per mesh."""
    factory = load_spec(spec)
    if not accepts_mesh(factory):
        raise CliError(
            f"spec {spec!r}: `ipujax plan` builds the workload for each mesh it tries, so "
            "its callable must take a mesh keyword (see examples/gpt/workloads.py)"
        )
    return factory


def _progress(text: str) -> None:
    # One write per line: the search's worker processes share stderr, and `print` writes the
    # line and its end apart, so two workers' lines could run together.
    sys.stderr.write(f"  {text}\n")
    sys.stderr.flush()

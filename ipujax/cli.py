"""The `ipujax` command line (docs/cli.md).

    ipujax cost-report SPEC [--target bow|mk2|mk1] [--mesh NAME=SIZE,...] [--phases auto]
                            [--json PATH] [--trace PATH] [--html PATH]
    ipujax report show PATH.json [--trace PATH] [--html PATH]
    ipujax report diff A.json B.json
    ipujax fidelity [--only TEXT] [--markdown PATH]
    ipujax plan SPEC [--system pod16|pod64|pod256|bow|...] [--target bow|mk2|mk1] [--json PATH]

SPEC is `path/to/file.py:NAME` or `package.module:NAME`; NAME is a callable returning
`(fun, args)` or `(fun, args, jit_kwargs)`. User errors (a bad spec, bad flags, a malformed report,
any `IpujaxError`) print one line `ipujax: error: ...` on stderr and exit with 2; anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

from ipujax.api import jit
from ipujax.errors import IpujaxError
from ipujax.fidelity import HIGH, LOW
from ipujax.report import CostReport
from partitioner import Mesh, Target, make_mesh

EXIT_ERROR = 2
TARGETS: dict[str, Callable[[], Target]] = {"bow": Target.bow, "mk2": Target.mk2, "mk1": Target.mk1}
_JIT_KEYWORDS = frozenset(inspect.signature(jit).parameters) - {"fun"}
_MESH_ITEM = re.compile(r"^\s*([A-Za-z_]\w*)\s*=\s*(\d+)\s*$")


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error raises `CliError` (one line) instead of printing the usage
    and exiting; subparsers inherit this class."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see `{self.prog} --help`)")


def _version() -> str:
    try:
        return version("ipujax")
    except PackageNotFoundError:
        return "unknown (not installed; run `make venv`)"


# ---- flags -----------------------------------------------------------------------------------


def parse_target(name: str) -> Target:
    factory = TARGETS.get(name.strip().lower())
    if factory is None:
        raise CliError(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}")
    return factory()


def parse_mesh(text: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """'data=2,model=8' -> ((2, 8), ('data', 'model'))."""
    sizes: list[int] = []
    names: list[str] = []
    for item in text.split(","):
        match = _MESH_ITEM.match(item)
        if not match or int(match.group(2)) < 1:
            raise CliError(
                f"--mesh {text!r}: expected NAME=SIZE[,NAME=SIZE...] with sizes >= 1, "
                "e.g. --mesh dp=2,tp=8"
            )
        names.append(match.group(1))
        sizes.append(int(match.group(2)))
    if len(set(names)) != len(names):
        raise CliError(f"--mesh {text!r}: each axis name may appear once")
    return tuple(sizes), tuple(names)


def parse_phases(text: str) -> Any:
    """'auto' -> 'auto', 'none' -> None, a positive count -> int."""
    value = text.strip().lower()
    if value in ("auto", "none"):
        return None if value == "none" else "auto"
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise CliError(f"--phases {text!r}: expected auto, none or a number of phases")


# ---- the workload spec -----------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    fun: Callable[..., Any]
    args: tuple[Any, ...]
    jit_kwargs: dict[str, Any]


def _load_file(path: Path, spec: str) -> ModuleType:
    if not path.is_file():
        raise CliError(f"spec {spec!r}: no such file {str(path)!r}")
    resolved = path.resolve()
    name = "_ipujax_spec_" + re.sub(r"\W", "_", resolved.stem)
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise CliError(f"spec {spec!r}: cannot load {str(path)!r} as Python")
    folder = str(resolved.parent)
    if folder not in sys.path:  # as `python file.py` would: its siblings import
        sys.path.insert(0, folder)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _import_module(dotted: str, spec: str) -> ModuleType:
    if not all(part.isidentifier() for part in dotted.split(".")):
        raise CliError(f"spec {spec!r}: {dotted!r} is neither a .py file nor a module name")
    if os.getcwd() not in sys.path and "" not in sys.path:  # as `python -m` would
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if missing and (dotted == missing or dotted.startswith(missing + ".")):
            raise CliError(f"spec {spec!r}: no module named {missing!r}") from None
        raise  # the workload itself imports something missing: its own traceback helps


def load_spec(spec: str) -> Callable[..., Any]:
    """The callable that `path/to/file.py:NAME` or `package.module:NAME` names."""
    location, sep, name = spec.rpartition(":")
    if not sep or not location or not name:
        raise CliError(f"spec {spec!r}: expected path/to/file.py:NAME or package.module:NAME")
    if not all(part.isidentifier() for part in name.split(".")):
        raise CliError(f"spec {spec!r}: {name!r} is not a Python name")
    if location.endswith(".py") or "/" in location or os.sep in location:
        module = _load_file(Path(location), spec)
    else:
        module = _import_module(location, spec)
    target: Any = module
    for part in name.split("."):
        if not hasattr(target, part):
            raise CliError(f"spec {spec!r}: {location} has no attribute {name!r}")
        target = getattr(target, part)
    if not callable(target):
        raise CliError(
            f"spec {spec!r}: {name} is a {type(target).__name__}, not a callable that "
            "returns (fun, args) or (fun, args, jit_kwargs)"
        )
    return target


def _accepts_mesh(factory: Callable[..., Any]) -> bool:
    try:
        parameter = inspect.signature(factory).parameters.get("mesh")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def call_workload(
    factory: Callable[..., Any], spec: str, mesh: Mesh | None, **extra: Any
) -> Workload:
    """Calls the spec's callable (with `mesh=` when given, and `extra` keywords) and checks
    what it returns."""
    kwargs = ({} if mesh is None else {"mesh": mesh}) | extra
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError:
        what = "with mesh=... only" if kwargs else "without arguments"
        raise CliError(f"spec {spec!r}: it must be callable {what}") from None
    except ValueError:
        pass  # no signature to check (a builtin): just call it
    result = factory(**kwargs)
    shape = "it must return (fun, args) or (fun, args, jit_kwargs)"
    if not isinstance(result, (tuple, list)) or len(result) not in (2, 3):
        got = f"{len(result)} items" if isinstance(result, (tuple, list)) else type(result).__name__
        raise CliError(f"spec {spec!r} returned {got}; {shape}")
    fun, args = result[0], result[1]
    jit_kwargs = result[2] if len(result) == 3 else {}
    if not callable(fun):
        raise CliError(f"spec {spec!r}: fun is a {type(fun).__name__}, not callable; {shape}")
    if not isinstance(args, (tuple, list)):
        raise CliError(f"spec {spec!r}: args is a {type(args).__name__}, not a tuple; {shape}")
    if not isinstance(jit_kwargs, dict):
        raise CliError(f"spec {spec!r}: jit_kwargs is a {type(jit_kwargs).__name__}, not a dict")
    unknown = sorted(str(k) for k in jit_kwargs if k not in _JIT_KEYWORDS)
    if unknown:
        raise CliError(
            f"spec {spec!r}: jit_kwargs has {unknown}, which ipujax.jit does not take "
            f"(it takes {sorted(_JIT_KEYWORDS)})"
        )
    return Workload(fun, tuple(args), dict(jit_kwargs))


def _mesh_from_flags(args: argparse.Namespace, base: Mesh | None) -> Mesh:
    """The mesh the flags ask for, filling what they leave out from `base` (or the defaults:
    one IPU on an axis named 'ipu', a Bow)."""
    target = parse_target(args.target) if args.target else (base.target if base else Target.bow())
    if args.mesh:
        sizes, names = parse_mesh(args.mesh)
    elif base is not None:
        sizes, names = base.axis_shapes, base.axis_names
    else:
        sizes, names = (1,), ("ipu",)
    return make_mesh(sizes, names, target=target)


def workload_for(args: argparse.Namespace) -> Workload:
    # Bad flags fail before any workload code runs.
    phases = parse_phases(args.phases) if args.phases is not None else None
    if args.target is not None:
        parse_target(args.target)
    if args.mesh is not None:
        parse_mesh(args.mesh)
    factory = load_spec(args.spec)
    if _accepts_mesh(factory):
        mesh = _mesh_from_flags(args, None)
        workload = call_workload(factory, args.spec, mesh)
        workload.jit_kwargs.setdefault("mesh", mesh)
    else:
        workload = call_workload(factory, args.spec, None)
        if args.target is not None or args.mesh is not None:
            given = workload.jit_kwargs.get("mesh")
            base = given if isinstance(given, Mesh) else None
            workload.jit_kwargs["mesh"] = _mesh_from_flags(args, base)
    if args.phases is not None:
        workload.jit_kwargs["phases"] = phases
    return workload


def compile_report(workload: Workload) -> CostReport:
    lowered = jit(workload.fun, **workload.jit_kwargs).lower(*workload.args)
    return lowered.compile(check_memory_fits=False).cost_report()


# ---- output ----------------------------------------------------------------------------------


def _console() -> Any:
    from rich.console import Console

    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120
    return Console(file=sys.stdout, width=width, highlight=False, soft_wrap=False)


def _write_views(report: CostReport, args: argparse.Namespace, console: Any) -> None:
    outputs: list[tuple[str, str | None, Callable[[], str]]] = [
        ("cost report JSON", getattr(args, "json", None), report.to_json),
        ("Chrome/Perfetto trace", getattr(args, "trace", None), lambda: _trace(report)),
        ("HTML report", getattr(args, "html", None), lambda: _html(report)),
    ]
    for what, path, text in outputs:
        if path is not None:
            _write(what, path, text(), console)


def _write(what: str, path: str, text: str, console: Any) -> None:
    """Writes `text` to `path` atomically; a failure is a user error naming the file."""
    from ipujax.views.atomic import write_atomic

    try:
        write_atomic(path, text)
    except OSError as error:
        raise CliError(f"cannot write {what} to {path!r}: {error.strerror or error}") from None
    console.print(f"wrote {what} to {path}", style="dim")


def _trace(report: CostReport) -> str:
    from ipujax.views.trace import trace_json

    return trace_json(report)


def _html(report: CostReport) -> str:
    from ipujax.views.html import render_html

    return render_html(report)


def read_report(path: str) -> CostReport:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CliError(f"no such report file {path!r}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise CliError(f"cannot read report {path!r}: {error}") from None
    try:
        return CostReport.from_json(text)
    except IpujaxError as error:
        raise CliError(f"{path}: {error}") from None


# ---- commands --------------------------------------------------------------------------------


def _cost_report(args: argparse.Namespace) -> int:
    from ipujax.views.tables import render

    report = compile_report(workload_for(args))
    console = _console()
    render(console, report, args.full)
    _write_views(report, args, console)
    return 0


def _report_show(args: argparse.Namespace) -> int:
    from ipujax.views.tables import render

    report = read_report(args.path)
    console = _console()
    render(console, report, args.full)
    _write_views(report, args, console)
    return 0


def _report_diff(args: argparse.Namespace) -> int:
    from ipujax.views.diff import render_diff

    a, b = read_report(args.a), read_report(args.b)
    render_diff(_console(), a, b, Path(args.a).name, Path(args.b).name)
    return 0


def _fidelity(args: argparse.Namespace) -> int:
    from ipujax import fidelity
    from ipujax.views.fidelity import render_fidelity

    figures = [f for f in fidelity.FIGURES if (args.only or "").lower() in f.name.lower()]
    if not figures:
        names = "; ".join(f.name for f in fidelity.FIGURES)
        raise CliError(f"--only {args.only!r} matches no figure; the figures are: {names}")
    rows = fidelity.run(figures)
    console = _console()
    render_fidelity(console, rows)
    if args.markdown:
        _write("the table", args.markdown, fidelity.document(rows), console)
    return 0 if all(row.within for row in rows) else 1


def _plan(args: argparse.Namespace) -> int:
    from ipujax import planning
    from ipujax.views.plans import render_plans

    planning.system_ipus(args.system)  # bad flags fail before any workload code runs
    target = parse_target(args.target) if args.target else None
    factory = load_spec(args.spec)
    if not _accepts_mesh(factory):
        raise CliError(
            f"spec {args.spec!r}: `ipujax plan` builds the workload for each mesh it tries, so "
            "its callable must take a mesh keyword (see examples/gpt/workloads.py)"
        )

    def call(mesh: Mesh, **extra: Any) -> tuple:
        workload = call_workload(factory, args.spec, mesh, **extra)
        return workload.fun, workload.args, workload.jit_kwargs

    def progress(text: str) -> None:
        print(f"  {text}", file=sys.stderr, flush=True)

    plans = planning.search(
        planning.workload_model(factory, call),
        args.system,
        target,
        confirm=args.confirm,
        progress=None if args.quiet else progress,
    )
    console = _console()
    render_plans(console, plans, args.spec, args.top)
    if args.json:
        _write("the ranked plans", args.json, plans.to_json(), console)
    return 0


def _add_outputs(parser: argparse.ArgumentParser, *, json_flag: bool) -> None:
    if json_flag:
        parser.add_argument("--json", metavar="PATH", help="write the cost report as JSON")
    parser.add_argument(
        "--trace", metavar="PATH", help="write a Chrome/Perfetto trace (open in ui.perfetto.dev)"
    )
    parser.add_argument("--html", metavar="PATH", help="write a self-contained HTML report")
    parser.add_argument(
        "--full",
        action="store_true",
        help="list every collective with why it was needed (default: grouped by kind, axes "
        "and source line)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ipujax",
        description="Compile JAX programs for a virtual Graphcore IPU and report their cost.",
        epilog="See docs/cli.md for what each table means.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    cost = commands.add_parser(
        "cost-report",
        help="compile a workload and print its cost report",
        description="Compile SPEC's workload for a virtual IPU and print its cost report.",
    )
    cost.add_argument(
        "spec",
        metavar="SPEC",
        help="path/to/file.py:NAME or package.module:NAME; NAME() returns (fun, args) or "
        "(fun, args, jit_kwargs), and gets mesh= when it takes a mesh keyword",
    )
    cost.add_argument("--target", metavar="|".join(TARGETS), help="the IPU (default: bow)")
    cost.add_argument(
        "--mesh", metavar="AXIS=N,...", help="mesh axes, e.g. dp=2,tp=8 (default: ipu=1)"
    )
    cost.add_argument("--phases", metavar="auto|none|N", help="phased execution (default: none)")
    _add_outputs(cost, json_flag=True)
    cost.set_defaults(run=_cost_report)

    report = commands.add_parser(
        "report", help="show or compare saved cost reports", description="Saved cost reports."
    )
    actions = report.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="print a saved report (JSON) as tables")
    show.add_argument("path", metavar="PATH.json")
    _add_outputs(show, json_flag=False)
    show.set_defaults(run=_report_show)
    diff = actions.add_parser("diff", help="compare two saved reports side by side")
    diff.add_argument("a", metavar="A.json")
    diff.add_argument("b", metavar="B.json")
    diff.set_defaults(run=_report_diff)

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
    fidelity.set_defaults(run=_fidelity)

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
    planner.add_argument("--target", metavar="|".join(TARGETS), help="the IPU (default: bow)")
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
    planner.set_defaults(run=_plan)
    return parser


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


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
        return int(args.run(args))
    except (CliError, IpujaxError) as error:
        print(f"ipujax: error: {_one_line(error)}", file=sys.stderr)
        return EXIT_ERROR

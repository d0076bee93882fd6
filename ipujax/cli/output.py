"""What the commands print and write: the console their tables go to, the `--json`, `--trace`
and `--html` files (written atomically; a failure is a `CliError` naming the file), the
`--trace`/`--html`/`--full` flags that ask for them, and a saved report read back."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ipujax.cli.errors import CliError
from ipujax.errors import IpujaxError
from ipujax.report import CostReport


def add_outputs(parser: argparse.ArgumentParser, *, json_flag: bool) -> None:
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


def open_console() -> Any:
    from rich.console import Console

    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120
    return Console(file=sys.stdout, width=width, highlight=False, soft_wrap=False)


def show_report(report: CostReport, args: argparse.Namespace) -> None:
    """The report's tables on the console (`--full` or one screen), then the files asked for."""
    from ipujax.views.tables import render

    out = open_console()
    render(out, report, args.full)
    _write_views(report, args, out)


def _write_views(report: CostReport, args: argparse.Namespace, console: Any) -> None:
    outputs: list[tuple[str, str | None, Callable[[], str]]] = [
        ("cost report JSON", getattr(args, "json", None), report.to_json),
        ("Chrome/Perfetto trace", getattr(args, "trace", None), lambda: _trace(report)),
        ("HTML report", getattr(args, "html", None), lambda: _html(report)),
    ]
    for what, path, text in outputs:
        if path is not None:
            write(what, path, text(), console)


# The files a command may be asked to write, by flag, as its messages name them.
_OUTPUTS = {"json": "JSON", "trace": "Chrome/Perfetto trace", "html": "HTML report"}


def check_outputs(args: argparse.Namespace) -> None:
    """Every file the command is asked to write can be, checked before any work: a run that
    fails on its last file leaves none of the others behind, and a plan search does not run
    for a minute to fail on its `--json`."""
    for flag, what in _OUTPUTS.items():
        path = getattr(args, flag, None)
        if path is None:
            continue
        folder = Path(path).parent
        if Path(path).is_dir():
            problem = "it is a folder"
        elif not folder.is_dir():
            problem = f"there is no folder {str(folder)!r}"
        elif not os.access(folder, os.W_OK | os.X_OK):
            problem = f"the folder {str(folder)!r} is not writable"
        else:
            continue
        raise CliError(f"cannot write {what} to {path!r} (--{flag}): {problem}")


def write(what: str, path: str, text: str, console: Any) -> None:
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

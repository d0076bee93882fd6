"""What the science scripts share: their device flags (--target, --tiles, --json), the mesh
they build, the check of ipujax's values against jax.jit's, and the rule that a user's mistake
is one line on stderr and exit status 2 (a failed check is status 1)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

import ipujax

if (EXAMPLES := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, EXAMPLES)  # examples/, for `shared`: see shared/__init__.py
from shared.files import write_report
from shared.flags import TARGETS, USER_ERRORS, UsageError, positive

NAMES = {"bow": "Bow", "mk2": "MK2", "mk1": "MK1"}  # --target's IPUs as the text names them


class CheckError(Exception):
    """ipujax's values are not jax.jit's within rounding: status 1."""


def parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """A script's parser, its docstring's first line as the description and the rest as the
    epilog, the device flags first."""
    first, _, rest = doc.partition("\n")
    made = argparse.ArgumentParser(
        prog=prog,
        description=first,
        epilog=rest.strip() or None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = made.add_argument
    add("--target", choices=sorted(TARGETS), default="bow", help="IPU generation (default bow)")
    add("--tiles", type=positive, default=None, help="tiles per IPU (default: all of them)")
    add("--json", default=None, metavar="PATH", help="write the cost report as JSON")
    return made


def make_mesh(args: argparse.Namespace, ipus: int, axis: str) -> ipujax.Mesh:
    """`ipus` IPUs of --target along `axis`, cut to --tiles tiles when given."""
    chip = TARGETS[args.target]()
    if args.tiles is not None:
        chip = chip.with_tiles(args.tiles)
    return ipujax.make_mesh((ipus,), (axis,), target=chip)


def check(ours: Any, theirs: Any, rtol: float, atol: float) -> float:
    """The largest |ipujax - jax.jit| over the leaves; CheckError when any element is off by
    more than atol + rtol |jax.jit's|."""
    worst = 0.0
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape:
            raise CheckError(f"ipujax's result has shape {a.shape}, jax.jit's {b.shape}")
        worst = max(worst, float(np.max(np.abs(a - b), initial=0.0)))
        if not np.allclose(a, b, rtol=rtol, atol=atol):
            raise CheckError(
                f"ipujax differs from jax.jit by up to {worst:.3g} (rtol {rtol}, atol {atol})"
            )
    return worst


def save(args: argparse.Namespace, report: ipujax.CostReport) -> None:
    """--json: the report, written atomically."""
    if args.json:
        write_report(args.json, report)


def run(
    main: Callable[[argparse.Namespace], int],
    made: argparse.ArgumentParser,
    argv: Sequence[str] | None,
) -> int:
    """`main(args)` on the parsed `argv`: a usage or user error is one line and status 2, a
    failed check one line and status 1."""
    args = made.parse_args(argv)
    try:
        return main(args)
    except UsageError as error:
        return _fail(made.prog, str(error), 2)
    except USER_ERRORS as error:
        return _fail(made.prog, f"{type(error).__name__}: {' '.join(str(error).split())}", 2)
    except CheckError as error:
        return _fail(made.prog, f"check against jax.jit failed: {error}", 1)


def _fail(prog: str, message: str, status: int) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return status

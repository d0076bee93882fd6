"""The command line every train.py shares: the IPU targets, the device, pipeline, check and
logging flags, and the rule that a user's mistake is one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import ipujax

TARGETS = {"bow": ipujax.Target.bow, "mk2": ipujax.Target.mk2, "mk1": ipujax.Target.mk1}
# Errors a run meets that are the user's to fix (a mesh too large for the system, a sharding
# the model does not allow, a step that does not fit): told like a bad flag, in one line.
USER_ERRORS = (ipujax.ConfigError, ipujax.ShardingError, ipujax.OutOfMemoryError)


class UsageError(Exception):
    """A bad flag (or a checkpoint that does not match them): one line on stderr, exit 2."""


def positive(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def parser(
    description: str, mesh_help: str, target: str = "bow", mesh: str | None = None
) -> argparse.ArgumentParser:
    """A train.py's parser, its device flags first: --target, --tiles and --mesh."""
    made = argparse.ArgumentParser(prog="train.py", description=description)
    add = made.add_argument
    add(
        "--target",
        choices=sorted(TARGETS),
        default=target,
        help=f"IPU generation (default {target})",
    )
    add("--tiles", type=positive, default=None, help="tiles per IPU (default: all of the target's)")
    add("--mesh", default=mesh, help=mesh_help)
    return made


def add_pipeline(made: argparse.ArgumentParser) -> None:
    add = made.add_argument
    add("--pipeline", action="store_true", help="pipeline the step over the mesh's pp axis")
    add("--microbatches", type=positive, default=2, help="micro-batches when pipelined (2)")


def add_check(made: argparse.ArgumentParser) -> None:
    add = made.add_argument
    add("--check", action="store_true", help="also run every step with jax.jit and compare")
    add("--report", default=None, metavar="PATH.json", help="write the step's cost report")


def add_logging(made: argparse.ArgumentParser, progress_bar: bool = True) -> None:
    add = made.add_argument
    add("--log-every", type=positive, default=10, help="print the loss every N steps (default 10)")
    if progress_bar:
        add("--no-progress", action="store_true", help="no progress bar")


def fail(message: str) -> int:
    print(f"train.py: error: {message}", file=sys.stderr)
    return 2


def run(
    train: Callable[[argparse.Namespace], int],
    made: argparse.ArgumentParser,
    argv: Sequence[str] | None,
) -> int:
    """`train(args)` on the parsed `argv`; a usage or user error is one line and status 2."""
    args = made.parse_args(argv)
    try:
        return train(args)
    except UsageError as error:
        return fail(str(error))
    except USER_ERRORS as error:
        return fail(f"{type(error).__name__}: {' '.join(str(error).split())}")

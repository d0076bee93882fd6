"""The flags that name the hardware and how the program runs: `--target` (the IPU), `--mesh` (the
axes), `--phases` and `--resident`, parsed into what `ipujax.jit` takes; a bad value is a
`CliError`."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any

from ipujax.cli.errors import CliError
from partitioner import Mesh, Target, make_mesh

TARGETS: dict[str, Callable[[], Target]] = {"bow": Target.bow, "mk2": Target.mk2, "mk1": Target.mk1}
_MESH_ITEM = re.compile(r"^\s*([A-Za-z_]\w*)\s*=\s*(\d+)\s*$")
_ARGNUM = re.compile(r"^-?\d+$")
_ARGNAME = re.compile(r"^[A-Za-z_]\w*$")


def add_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", metavar="|".join(TARGETS), help="the IPU (default: bow)")


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
    """'auto' -> 'auto', 'none' -> None, 'NAME,NAME,...' -> the `jax.named_scope` names whose
    blocks are the phases. A count is refused: phases are blocks of the program."""
    value = text.strip()
    if value.lower() in ("auto", "none"):
        return None if value.lower() == "none" else "auto"
    names = tuple(name.strip() for name in value.split(","))
    if value.isdigit() or not all(names):
        raise CliError(
            f"--phases {text!r}: expected auto, none or named scopes NAME,NAME,... "
            "(phases are blocks of the program, not a count)"
        )
    return names


def parse_resident(text: str) -> dict[str, tuple]:
    """'0' -> resident_argnums (0,), 'params' -> resident_argnames ('params',); a list may mix
    positions and names ('0,cache'). Both keys are set: the flag replaces the workload's."""
    items = [item.strip() for item in text.split(",")]
    if not all(_ARGNUM.match(item) or _ARGNAME.match(item) for item in items):
        raise CliError(
            f"--resident {text!r}: expected argument positions or parameter names, "
            "comma-separated, e.g. --resident 0 or --resident params,cache"
        )
    nums = tuple(int(item) for item in items if _ARGNUM.match(item))
    names = tuple(item for item in items if _ARGNAME.match(item))
    return {"resident_argnums": nums, "resident_argnames": names}


def mesh_from_flags(args: argparse.Namespace, base: Mesh | None) -> Mesh:
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

"""The examples' meshes: `--mesh NAME=SIZE,...` read, the mesh of --target, --tiles and --mesh
built, a model's objection to it told as a usage error, an axis's size; and the GPT's and
BERT's steps on a mesh: their global batch, their pipeline over a `pp` axis and the keywords
`ipujax.jit` takes for them."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import ipujax

from .flags import TARGETS, UsageError

ONE_IPU = "ipu=1"  # the mesh without --mesh, where a script has no default of its own
PIPELINE_AXIS = "pp"  # a mesh axis of this name is the stages of a pipelined step


def parse_mesh(text: str, usage: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """'dp=2,tp=2' -> ((2, 2), ('dp', 'tp')); `usage` says what was expected, with an example."""
    sizes, names = [], []
    for part in text.split(","):
        name, sep, size = part.strip().partition("=")
        if not sep or not name or not size.strip().isdigit() or int(size) < 1:
            raise UsageError(f"--mesh {text!r}: expected {usage}")
        names.append(name.strip())
        sizes.append(int(size))
    return tuple(sizes), tuple(names)


def make_mesh(args: argparse.Namespace, text: str, usage: str) -> ipujax.Mesh:
    """The mesh `text` (the --mesh flag, or the script's default) of --target's IPUs, cut down
    to --tiles tiles when given."""
    target = TARGETS[args.target]()
    if args.tiles is not None:
        target = target.with_tiles(args.tiles)
    sizes, names = parse_mesh(text, usage)
    return ipujax.make_mesh(sizes, names, target=target)


@contextlib.contextmanager
def mesh_errors(flag: str | None) -> Iterator[None]:
    """A model's ValueError about the mesh (heads that do not split, an unknown axis) becomes
    a usage error of --mesh `flag`."""
    try:
        yield
    except ValueError as error:
        raise UsageError(f"--mesh {flag}: {error}") from None


def axis_size(mesh: Any, name: str) -> int:
    """The size of the mesh's axis `name`: 1 without one, or without a mesh."""
    if mesh is None:
        return 1
    return dict(zip(mesh.axis_names, mesh.axis_shapes, strict=True)).get(name, 1)


def pipelined(mesh: Any) -> bool:
    return mesh is not None and PIPELINE_AXIS in mesh.axis_names


def require_pipeline_axis(mesh: ipujax.Mesh) -> None:
    """--pipeline's mesh has the axis to pipeline over."""
    if not pipelined(mesh):
        raise UsageError(f"--pipeline needs a mesh axis named {PIPELINE_AXIS}")


def global_batch(mesh: Any, per_replica: int, microbatches: int) -> int:
    """`per_replica` (a micro-batch's, when pipelined) times dp, times the micro-batches of a
    step when the mesh has a `pp` axis."""
    return per_replica * axis_size(mesh, "dp") * (microbatches if pipelined(mesh) else 1)


def pipeline(microbatches: int, offchip: bool = False) -> ipujax.Pipeline:
    """The step pipelined over the `pp` axis, one stage per IPU of it, balanced over the
    layers, each stage recomputed in the backward pass (the optimizer's state in streaming
    memory with `offchip`)."""
    return ipujax.Pipeline(
        PIPELINE_AXIS,
        "auto",
        microbatches=microbatches,
        recompute=True,
        optimizer_state_offchip=offchip,
    )


def jit_kwargs(
    mesh: Any,
    sharding: ModuleType,
    state: tuple[Any, Any],
    heads: int,
    microbatches: int,
    offchip: bool = False,
) -> dict[str, Any]:
    """`ipujax.jit`'s keywords for a transformer's step on `mesh` (none without a mesh): the
    in_shardings that `sharding` (the example's sharding.py) derives for `state`, (params,
    opt_state), from the mesh's axis names, and with a `pp` axis the pipeline over it."""
    if mesh is None:
        return {}
    sharding.check_divisible(mesh, heads)
    kwargs: dict[str, Any] = {"mesh": mesh, "in_shardings": sharding.train_specs(*state, mesh)}
    if pipelined(mesh):
        kwargs["pipeline"] = pipeline(microbatches, offchip)
    return kwargs

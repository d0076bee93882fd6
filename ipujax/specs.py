"""User shardings (pytrees of `PartitionSpec`, as `jax.jit` takes them) per argument leaf.

As in `jax.jit`, `in_shardings` is a prefix of the positional arguments: a single spec applies to
every argument, a tuple has one entry per argument, and each entry applies to every leaf below
it. `None` leaves the choice to propagation; `P()` fixes a tensor as replicated. A
`NamedSharding` stands for its `PartitionSpec`.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from partitioner import ShardingError


def _is_spec_leaf(x: Any) -> bool:
    return x is None or isinstance(x, (PartitionSpec, NamedSharding))


def _spec(x: Any) -> PartitionSpec | None:
    """A leaf as a PartitionSpec: a `NamedSharding` is its `.spec` (the mesh's axis names are
    the ones `jit`'s mesh must have; its devices are jax's, not IPUs)."""
    return x.spec if isinstance(x, NamedSharding) else x


def per_leaf(
    prefix: Any, tree: Any, what: str, against: str = "the arguments'"
) -> list[PartitionSpec | None]:
    """One spec (or None) per leaf of `tree`, broadcasting the prefix tree `prefix`."""
    if _is_spec_leaf(prefix):
        return [_spec(prefix)] * len(jax.tree.leaves(tree))
    specs, structure = jax.tree.flatten(prefix, is_leaf=_is_spec_leaf)
    try:
        subtrees = structure.flatten_up_to(tree)  # type: ignore[attr-defined]
    except (ValueError, TypeError) as error:
        raise ShardingError(
            f"{what} has structure {structure}, which is not a prefix of {against} "
            f"structure {jax.tree.structure(tree)}: {error}"
        ) from None
    flat: list[PartitionSpec | None] = []
    for spec, subtree in zip(specs, subtrees, strict=True):
        flat.extend([_spec(spec)] * len(jax.tree.leaves(subtree)))
    return flat


def input_specs(in_shardings: Any, args: tuple, kwargs: dict) -> list[PartitionSpec | None]:
    """Specs for the leaves of `(args, kwargs)`, in the order jax flattens them."""
    if isinstance(in_shardings, list):
        in_shardings = tuple(in_shardings)
    if isinstance(in_shardings, tuple) and len(in_shardings) != len(args):
        raise ShardingError(
            f"in_shardings has {len(in_shardings)} entries for {len(args)} positional arguments; "
            "give one entry (a PartitionSpec, a pytree of them, or None) per argument"
        )
    positional = per_leaf(in_shardings, args, "in_shardings")
    return positional + [None] * len(jax.tree.leaves(kwargs))


def output_specs(out_shardings: Any, out_tree: Any) -> list[PartitionSpec | None]:
    dummy = jax.tree.unflatten(out_tree, [0] * out_tree.num_leaves)
    return per_leaf(out_shardings, dummy, "out_shardings", "the outputs'")

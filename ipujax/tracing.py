"""Tracing: the user's function to the IR (`lowering.lower`), under the jax mesh its call
resolved to, with dead code dropped.

Under an ipujax mesh's abstract twin, `with_sharding_constraint(x, P("tp"))` traces, and so does
a `shard_map` over the mesh. Under a jax mesh with Explicit axes the arguments are traced with
their shardings in their types (`typed`), as `jax.jit` traces them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

from lowering import Graph, eliminate_dead_code, lower, raised_at
from partitioner import ShardingError


def traced(
    fun: Callable[..., Any], args: Sequence[Any], kwargs: dict, traced_under: AbstractMesh
) -> Graph:
    """`fun` traced and imported under `traced_under`, dead code dropped."""
    with jax.sharding.use_abstract_mesh(traced_under), _shard_map_refused():
        return eliminate_dead_code(lower(fun, *args, **kwargs))


def typed(
    args: tuple, kwargs: dict, specs: Sequence[PartitionSpec | None], mesh: AbstractMesh
) -> tuple[tuple, dict, list[PartitionSpec | None]]:
    """The arguments as jax.jit traces them on a mesh with Explicit axes: each array leaf a
    `ShapeDtypeStruct` split as its spec says, else as the array is (a `NamedSharding` over
    the mesh's axes), else replicated; and the specs used. Python scalars stay as they are."""
    leaves, tree = jax.tree.flatten((args, kwargs))
    used: list[PartitionSpec | None] = []
    out = []
    for leaf, spec in zip(leaves, specs, strict=True):
        if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
            out.append(leaf)
            used.append(spec)
            continue
        spec = spec if spec is not None else _own_spec(leaf, mesh)
        out.append(jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, spec)))
        used.append(spec)
    typed_args, typed_kwargs = jax.tree.unflatten(tree, out)
    return typed_args, typed_kwargs, used


def _own_spec(leaf: Any, mesh: AbstractMesh) -> PartitionSpec:
    sharding = getattr(leaf, "sharding", None)
    if isinstance(sharding, NamedSharding) and sharding.mesh.axis_names == mesh.axis_names:
        return sharding.spec
    return PartitionSpec()


@contextlib.contextmanager
def _shard_map_refused() -> Iterator[None]:
    """jax's refusal of a `shard_map` (specs its arguments do not match, an output its specs
    call replicated that is not) as a `ShardingError` at the user's line, with jax's reason."""
    try:
        yield
    except ValueError as error:
        if "shard_map" not in str(error):
            raise
        reason = " ".join(str(error).split())
        raise ShardingError(f"jax refused the shard_map at {raised_at(error)}: {reason}") from None

"""Tracing: the user's function to the IR (`lowering.lower`), under the jax mesh its call
resolved to, with dead code dropped.

Under an ipujax mesh's abstract twin, `with_sharding_constraint(x, P("tp"))` traces; under a jax
mesh's own, so does a `shard_map` over it, which ipujax then refuses at the user's line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
from jax.sharding import AbstractMesh

from lowering import (
    SHARD_MAP_DETAIL,
    Graph,
    UnsupportedOpError,
    eliminate_dead_code,
    lower,
    raised_at,
)


def traced(
    fun: Callable[..., Any], args: Sequence[Any], kwargs: dict, traced_under: AbstractMesh
) -> Graph:
    """`fun` traced and imported under `traced_under`, dead code dropped."""
    with jax.sharding.use_abstract_mesh(traced_under), _shard_map_refused():
        return eliminate_dead_code(lower(fun, *args, **kwargs))


@contextlib.contextmanager
def _shard_map_refused() -> Iterator[None]:
    """jax's refusal of a `shard_map` whose mesh is not the one traced under (an Explicit one),
    as ipujax's refusal of every `shard_map`, at the user's line."""
    try:
        yield
    except ValueError as error:
        if "shard_map" not in str(error):
            raise
        raise UnsupportedOpError("shard_map", raised_at(error), SHARD_MAP_DETAIL) from None

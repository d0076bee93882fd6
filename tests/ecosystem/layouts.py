"""The meshes tests/ecosystem runs each model on, and the check of a step against jax.jit.

A `Layout` is one IPU, four IPUs data parallel (`dp=4`) or a 2 x 2 mesh (`dp=2`, `tp=2`, some
weight matrices split by columns over `tp`), with the specs a model's arguments take on it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import jax
from helpers import assert_trees_close, target
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import ipujax

# Each model is small (widths 8-32, batch 8), so 16 tiles per IPU hold it and compile fast.
TILES = 16


@dataclass(frozen=True)
class Layout:
    """A mesh and the specs a model's arguments take on it."""

    name: str
    mesh: ipujax.Mesh
    dp: bool  # the mesh has a "dp" axis the batch is split over
    tp: bool  # the mesh has a "tp" axis some weight matrices are split over

    @property
    def batch(self) -> P | None:
        """The spec of a batch argument: split over dp where there is a dp axis."""
        return P("dp") if self.dp else None

    @property
    def columns(self) -> P | None:
        """The spec of a weight matrix whose output columns are split over tp."""
        return P(None, "tp") if self.tp else None

    def weights(self, tree: Any, split: Iterable[str]) -> Any:
        """Specs for a pytree of weights: on a tp mesh, the leaves of two or more axes whose path
        names one of `split` have their last axis split over tp (a weight matrix by columns, a
        stack of them each by columns); every other leaf is left to propagation."""
        names = set(split)

        def spec(path: tuple, leaf: Any) -> P | None:
            keys = {str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path}
            if not (self.tp and jax.numpy.ndim(leaf) >= 2 and keys & names):
                return None
            return P(*[None] * (jax.numpy.ndim(leaf) - 1), "tp")

        return jax.tree_util.tree_map_with_path(spec, tree)

    def check(
        self,
        step: Callable[..., Any],
        args: tuple,
        in_shardings: tuple,
        rtol: float = 1e-5,
        atol: float = 1e-6,
    ) -> Any:
        """`step(*args)` through ipujax.jit on this mesh equals jax.jit's, leaf by leaf, and the
        inputs were split over every axis of the mesh but a one-IPU mesh's."""
        expected = jax.jit(step)(*args)
        jitted = ipujax.jit(step, mesh=self.mesh, in_shardings=in_shardings)
        compiled = jitted.lower(*args).compile()
        ours = compiled(*args)
        assert_trees_close(key_data(ours), key_data(expected), rtol=rtol, atol=atol)
        wanted = {axis for axis, on in (("dp", self.dp), ("tp", self.tp)) if on}
        assert split_axes(compiled.input_shardings) == wanted
        return ours


def split_axes(shardings: Any) -> set[str]:
    """The mesh axes some leaf of a pytree of `NamedSharding`s is split over."""
    axes: set[str] = set()
    for sharding in jax.tree.leaves(shardings, is_leaf=lambda s: isinstance(s, NamedSharding)):
        for entry in sharding.spec:
            axes.update(entry if isinstance(entry, tuple) else () if entry is None else (entry,))
    return axes


def key_data(tree: Any) -> Any:
    """`tree` with its typed PRNG keys as their raw uint32 data, which numpy can compare."""

    def plain(leaf: Any) -> Any:
        is_key = jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key)
        return jax.random.key_data(leaf) if is_key else leaf

    return jax.tree.map(plain, tree)


def _layouts() -> dict[str, Layout]:
    one = ipujax.make_mesh((1,), ("ipu",), target=target(TILES))
    dp4 = ipujax.make_mesh((4,), ("dp",), target=target(TILES))
    dp2_tp2 = ipujax.make_mesh((2, 2), ("dp", "tp"), target=target(TILES))
    return {
        "1ipu": Layout("1ipu", one, dp=False, tp=False),
        "dp4": Layout("dp4", dp4, dp=True, tp=False),
        "dp2xtp2": Layout("dp2xtp2", dp2_tp2, dp=True, tp=True),
    }


LAYOUTS = _layouts()

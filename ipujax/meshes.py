"""Which mesh a call runs on, and which jax mesh its function is traced under.

`jit(mesh=...)` takes an ipujax mesh or a jax one; without one, the mesh comes from the context
of the call (a `with mesh:` block, `jax.set_mesh`), else one IPU. Each lowering resolves it once
(`mesh_in_context`) and keeps it. Tracing is under the jax mesh's abstract twin: with Auto axes
(an ipujax mesh's, and a jax mesh's that has no Explicit axis) shardings stay out of the traced
types and the partitioner chooses them; a jax mesh with Explicit axes keeps them, so shardings
are in the types (`jax.typeof`), `reshard` and `jax.P` mean what jax says (`tracing.typed`).
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import AbstractMesh

from partitioner import ConfigError, Mesh, active_mesh, default_mesh, make_mesh


def mesh_in_context(
    given: Mesh | None, traced_under: AbstractMesh | None
) -> tuple[Mesh, AbstractMesh]:
    """The mesh a call runs on and the jax mesh it is traced under: the mesh `jit` was given,
    else the innermost `with mesh:` block's, else the one `jax.set_mesh` made current (traced
    under its Auto twin), else one IPU. An ipujax mesh is traced under its abstract twin."""
    mesh = given or active_mesh()
    if mesh is None and not (current := jax.sharding.get_abstract_mesh()).empty:
        return as_mesh(current), _twin(current)
    mesh = mesh or default_mesh()
    return mesh, traced_under or AbstractMesh(mesh.axis_shapes, mesh.axis_names)


def as_mesh(mesh: Any) -> Mesh:
    """An ipujax mesh from `mesh=`: an ipujax `Mesh`, a `jax.sharding.Mesh` or `AbstractMesh`
    (its axis names and sizes, on Bow IPUs: `ipujax.make_mesh(..., target=)` picks another),
    or None (one IPU)."""
    if mesh is None:
        return default_mesh()
    if isinstance(mesh, Mesh):
        return mesh
    if isinstance(mesh, (jax.sharding.Mesh, AbstractMesh)):
        return make_mesh(tuple(mesh.axis_sizes), tuple(mesh.axis_names))
    raise ConfigError(
        f"ipujax.jit(mesh=...) takes an ipujax.Mesh or a jax.sharding.Mesh, got "
        f"{type(mesh).__name__}; build one with ipujax.make_mesh(sizes, names)"
    )


def jax_twin(mesh: Any) -> AbstractMesh | None:
    """The abstract mesh to trace under when `jit` is given a jax mesh, else None."""
    if isinstance(mesh, jax.sharding.Mesh):
        return _twin(mesh.abstract_mesh)
    return _twin(mesh) if isinstance(mesh, AbstractMesh) else None


def explicit(mesh: AbstractMesh) -> bool:
    return any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)


def _twin(mesh: AbstractMesh) -> AbstractMesh:
    """The mesh to trace under: as it is when an axis is Explicit (shardings in the types, as
    jax.jit traces it), else with every axis Auto (a Manual one from an enclosing shard_map
    included): shardings stay out of the traced types and the partitioner chooses them."""
    if explicit(mesh):
        return mesh
    return mesh.update_axis_types(dict.fromkeys(mesh.axis_names, jax.sharding.AxisType.Auto))

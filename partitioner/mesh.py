"""Meshes of virtual IPUs and the systems that hold them.

A mesh names axes over IPUs, as `jax.sharding.Mesh` names axes over devices. The IPUs belong to
a Graphcore system, the smallest that holds them (docs/target.md, "Systems"): an IPU-M2000 or
Bow-2000 machine (4 IPUs), a Pod16 (4 machines in an open column, a ladder), a Pod64 (16
machines whose column closes into a ring: the IPU-Link 2D torus) or a Pod256 (4 Pod64s joined by
Gateway-Links). The machine and Pod64 sizes are stated here once; laying collectives on the links
(`cost.topology`) reads them, and whether the column is a torus, from the system.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from partitioner.errors import ConfigError
from partitioner.target import Target

IPUS_PER_MACHINE = 4  # V: an IPU-M2000 or Bow-2000 holds 4 IPUs
IPUS_PER_POD64 = 64  # V: 16 machines joined by IPU-Links


@dataclass(frozen=True, slots=True)
class System:
    name: str
    ipus: int
    ipus_per_machine: int = IPUS_PER_MACHINE
    ipus_per_pod64: int = IPUS_PER_POD64
    torus: bool = False  # the column of machines closes into a ring (V: a Pod64's 2D torus)


SYSTEMS: tuple[System, ...] = (
    System("IPU-M2000/Bow-2000", IPUS_PER_MACHINE),
    System("Pod16", 4 * IPUS_PER_MACHINE),
    System("Pod64", IPUS_PER_POD64, torus=True),
    System("Pod256", 4 * IPUS_PER_POD64, torus=True),
)


def system_for(ipus: int) -> System:
    for system in SYSTEMS:
        if ipus <= system.ipus:
            return system
    raise ConfigError(
        f"a mesh of {ipus} IPUs is larger than the largest system, a Pod256 (256 IPUs); "
        "use at most 256 IPUs"
    )


@dataclass(frozen=True, slots=True)
class Mesh:
    """Named axes over the IPUs of one system, all of one `Target`."""

    axis_shapes: tuple[int, ...]
    axis_names: tuple[str, ...]
    target: Target
    system: System

    @property
    def ipus(self) -> int:
        return math.prod(self.axis_shapes)

    @property
    def shape(self) -> dict[str, int]:
        return dict(zip(self.axis_names, self.axis_shapes, strict=True))

    @property
    def abstract_mesh(self) -> Any:
        """The mesh as jax names one (a `jax.sharding.AbstractMesh`, its axes Auto), for the
        jax APIs that take a jax mesh alone: `jax.shard_map(..., mesh=mesh.abstract_mesh)`
        inside a function jitted over this mesh, as `jax.sharding.Mesh.abstract_mesh` is."""
        from jax.sharding import AbstractMesh

        return AbstractMesh(self.axis_shapes, self.axis_names)

    def __str__(self) -> str:
        axes = ", ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.axis_shapes, strict=True))
        return f"Mesh({axes}) of {self.target.name} IPUs in a {self.system.name}"

    def __enter__(self) -> Mesh:
        """`with mesh:` makes this the mesh of `ipujax.jit` calls that name none, as jax's
        `with jax.set_mesh(mesh):` does for `jax.jit`."""
        _ACTIVE.set((*_ACTIVE.get(), self))
        return self

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.set(_ACTIVE.get()[:-1])


# The meshes `with mesh:` blocks entered, innermost last (per thread and task, as jax's).
_ACTIVE: ContextVar[tuple[Mesh, ...]] = ContextVar("ipujax_meshes", default=())


def active_mesh() -> Mesh | None:
    """The mesh of the innermost `with mesh:` block, if any."""
    meshes = _ACTIVE.get()
    return meshes[-1] if meshes else None


def make_mesh(
    axis_shapes: Sequence[int], axis_names: Sequence[str], *, target: Target | None = None
) -> Mesh:
    """A mesh of virtual IPUs, like `jax.make_mesh`; the default target is Bow."""
    shapes, names = tuple(axis_shapes), tuple(axis_names)
    if len(shapes) != len(names):
        raise ConfigError(
            f"make_mesh got {len(shapes)} axis sizes {shapes} for {len(names)} names {names}; "
            "give one size per name"
        )
    if any(not isinstance(s, int) or s < 1 for s in shapes):
        raise ConfigError(f"mesh axis sizes must be positive integers, got {shapes}")
    if len(set(names)) != len(names):
        raise ConfigError(f"mesh axis names must be distinct, got {names}")
    target = target or Target.bow()
    return Mesh(shapes, names, target, system_for(math.prod(shapes)))


def default_mesh() -> Mesh:
    return make_mesh((1,), ("ipu",))

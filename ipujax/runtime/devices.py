"""Real jax devices under the virtual IPUs: which mesh axes are spread over which devices.

A mesh of virtual IPUs runs as one jitted function (see runtime). With several real devices
visible (GPUs, or CPU devices forced with `XLA_FLAGS=--xla_force_host_platform_device_count=N`),
some mesh axes are split over a `jax.sharding.Mesh` of them, and XLA's SPMD partitioner gives
each device its IPUs' share of the work. An axis of size s can go over any f devices with f
dividing s; as many devices are used as the axes can share, with the most on the best axes. An
axis is the better the more input bytes are split over it (weights over tp, say: a device
then holds and updates only its share) and the fewer bytes its collectives move per IPU (those
now cross devices). docs/distributed.md has the measurements behind the rule. Under
`jax.distributed`, `jax.devices()` lists every process's devices in the same order everywhere,
so every process makes the same plan.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from partitioner import Partitioned, Sharding, axis_traffic

Array = Any


@dataclass(frozen=True)
class DevicePlan:
    """Mesh axes spread over real devices: each spread axis is a dimension of `mesh`, named
    `device_axes[axis]`, whose size divides the axis's."""

    mesh: jax.sharding.Mesh
    device_axes: dict[str, str]

    @property
    def devices(self) -> tuple[jax.Device, ...]:
        return tuple(self.mesh.devices.flat)

    def constrain(self, x: Array, leading: Sequence[str]) -> Array:
        """`x`, whose leading dimensions are the mesh axes `leading`, split along the spread
        ones over their devices and whole along everything else."""
        spec = PartitionSpec(*(self.device_axes.get(a) for a in leading))
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

    def global_sharding(
        self, sharding: Sharding, shape: tuple[int, ...], sizes: dict[str, int]
    ) -> NamedSharding:
        """Where a whole (unsplit) input or output lives: a dimension whose major-most mesh axis
        is spread, and which divides without padding, is split over that axis's devices in
        contiguous runs, as the split into IPUs cuts it; everything else is on every device."""
        spec = []
        for dim, axes in enumerate(sharding.dims):
            groups = math.prod(sizes[a] for a in axes)
            even = bool(axes) and shape[dim] % groups == 0
            spec.append(self.device_axes.get(axes[0]) if even else None)
        return NamedSharding(self.mesh, PartitionSpec(*spec))


def default_device() -> jax.Device:
    """Where jax runs a computation of uncommitted arrays: `jax_default_device`, else the first
    device of this process on the default backend."""
    # jax's Config declares its options dynamically, so read this one by name.
    chosen = getattr(jax.config, "jax_default_device", None)
    if isinstance(chosen, jax.Device):
        return chosen
    return jax.local_devices(backend=chosen)[0]


def split_bytes(partitioned: Partitioned) -> dict[str, int]:
    """Global input bytes split over each mesh axis."""
    split: dict[str, int] = {}
    graph = partitioned.global_graph
    for value, sharding in zip(graph.inputs, partitioned.input_shardings, strict=True):
        for axes in sharding.dims:
            for axis in axes:
                split[axis] = split.get(axis, 0) + value.nbytes
    return split


def _best_first(partitioned: Partitioned, axis_names: Sequence[str]) -> list[str]:
    """The mesh axes by the input bytes split over them less the bytes their collectives move per
    IPU; the mesh's own order breaks ties (sorted is stable)."""
    split = split_bytes(partitioned)
    traffic = axis_traffic(partitioned.graph)
    return sorted(axis_names, key=lambda a: traffic.get(a, 0) - split.get(a, 0))


def _factors(sizes: dict[str, int], order: Sequence[str], devices: int) -> dict[str, int]:
    """Devices per axis, each count dividing its axis's size: as many devices in all as can be
    used (at most `devices`), and of those splits the one with the most on the axes first in
    `order`. Meshes have a few axes of a few divisors each, so every split is tried."""
    choices = [[f for f in range(1, sizes[a] + 1) if sizes[a] % f == 0] for a in order]
    fitting = (split for split in itertools.product(*choices) if math.prod(split) <= devices)
    best = max(fitting, key=lambda split: (math.prod(split), split))
    return {a: f for a, f in zip(order, best, strict=True) if f > 1}


def plan_devices(
    partitioned: Partitioned,
    axis_names: Sequence[str],
    sizes: dict[str, int],
    devices: Sequence[jax.Device],
) -> DevicePlan | None:
    """How to spread the mesh over `devices`, or None to run on one device as before."""
    if len(devices) < 2:
        return None
    order = _best_first(partitioned, axis_names)
    factors = _factors(sizes, order, len(devices))
    if not factors:
        return None
    spread = [a for a in axis_names if a in factors]
    count = math.prod(factors.values())
    grid = np.array(list(devices[:count]), dtype=object).reshape([factors[a] for a in spread])
    device_axes = {a: f"devices_{a}" for a in spread}
    mesh = jax.sharding.Mesh(grid, tuple(device_axes[a] for a in spread))
    return DevicePlan(mesh, device_axes)

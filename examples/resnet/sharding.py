"""PartitionSpecs for the ResNet of `model.py`: data parallel only.

Images [N, H, W, C] and labels [N] are split over `dp` on the batch dimension; parameters, batch
norm's running statistics and the optimizer's state are replicated (`P()`, a prefix that covers
every leaf below it). A mesh of one IPU (the default axis `ipu`) has nothing to split.

Batch norm's means are over the whole batch the step is given unless the step normalises each
replica's share apart (`model.make_train_step(..., replicas=)`): over `dp` the whole batch's
become AllReduces (the synchronised batch norm, derived by the partitioner), a replica's share's
stay on its IPU.
"""

from __future__ import annotations

from typing import Any

from jax.sharding import PartitionSpec as P

KNOWN_AXES = ("dp", "ipu")


def _names(mesh: Any) -> tuple[str, ...]:
    return tuple(mesh.axis_names)


def dp_size(mesh: Any) -> int:
    """The size of the mesh's `dp` axis (1 without one, or without a mesh)."""
    if mesh is None:
        return 1
    return dict(zip(mesh.axis_names, mesh.axis_shapes, strict=True)).get("dp", 1)


def check_mesh(mesh: Any) -> None:
    """The ResNet runs data parallel: a mesh of `dp` (or the one-IPU axis `ipu`) only."""
    unknown = sorted(set(_names(mesh)) - set(KNOWN_AXES))
    if unknown:
        raise ValueError(f"mesh axes {unknown} are not ResNet axes; the ResNet uses dp only")


def batch_spec(mesh: Any, accumulation: int = 1) -> P:
    """Images and labels: the batch split over dp, when the mesh has it (with gradient
    accumulation, the dim after the micro-batches')."""
    if "dp" not in _names(mesh):
        return P()
    return P(None, "dp") if accumulation > 1 else P("dp")


def train_specs(
    mesh: Any, accumulation: int = 1, per_replica_stats: bool = False
) -> tuple[P, P, P, P, P]:
    """in_shardings for `train_step(params, bn_state, opt_state, images, labels)`; running
    statistics kept per replica ([replicas, C]) are split over dp."""
    check_mesh(mesh)
    batch = batch_spec(mesh, accumulation)
    stats = P("dp") if per_replica_stats and "dp" in _names(mesh) else P()
    return P(), stats, P(), batch, batch

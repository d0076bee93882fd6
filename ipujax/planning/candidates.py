"""What the plan search tries: the systems it knows by name, the meshes over all of a system's
IPUs (axes named as the examples' sharding rules read them) and each mesh's variants (phases,
a pipeline's micro-batches and recomputation)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ipujax.errors import ConfigError
from partitioner import IPUS_PER_MACHINE, IPUS_PER_POD64, SYSTEMS

# The axis names of the meshes a plan builds, the convention the examples' sharding rules read
# (replicas, Megatron 1D, PopXL 2D, pipeline stages). Only plans name axes: the partitioner finds
# the replica axes from the shardings, never by name.
MESH_AXES: tuple[str, str, str, str, str] = ("dp", "tp", "tp1", "tp2", "pp")
REPLICAS, TENSOR, TENSOR_ROWS, TENSOR_COLUMNS, PIPELINE_AXIS = MESH_AXES
# The mesh layouts tried, axes outermost first: replicas outermost, as Graphcore laid them, so
# tensor-parallel groups are neighbouring IPUs.
LAYOUTS: tuple[tuple[str, ...], ...] = (
    (REPLICAS,),
    (REPLICAS, TENSOR),
    (REPLICAS, TENSOR_ROWS, TENSOR_COLUMNS),
    (REPLICAS, PIPELINE_AXIS),
    (REPLICAS, PIPELINE_AXIS, TENSOR),
)
MICRO_BATCH_SIZES = (1, 2, 4, 8, 16, 32)  # pipelined, per replica: what a plan may cut into


def _typed(name: str) -> str:
    """A system's name as `--system` reads it: lower case, without dashes or underscores."""
    return name.strip().lower().replace("-", "").replace("_", "")


_MACHINE = next(s for s in SYSTEMS if s.ipus == IPUS_PER_MACHINE)
# The names a system goes by (docs/target.md, "Systems"), smallest first as the error lists them:
# the partitioner's systems by their own names, a machine (IPU-M2000 or Bow-2000) by its usual
# ones, and two sizes that are no system of their own: one IPU, and a Pod128 (two Pod64s, in a
# Pod256). The chip is `target`'s (Bow default).
SYSTEM_IPUS: dict[str, int] = dict(
    sorted(
        {
            "ipu": 1,
            **dict.fromkeys(("bow", "bow2000", "m2000", "pod4"), _MACHINE.ipus),
            **{_typed(s.name): s.ipus for s in SYSTEMS if s is not _MACHINE},
            "pod128": 2 * IPUS_PER_POD64,
        }.items(),
        key=lambda item: item[1],
    )
)


def system_ipus(name: str) -> int:
    """The IPUs of a system named `pod16`, `pod256`, `bow` (a Bow-2000), ... or a count."""
    key = _typed(name)
    if key.isdigit() and int(key) >= 1:
        return int(key)
    if key not in SYSTEM_IPUS:
        raise ConfigError(
            f"unknown system {name!r}; choose one of {', '.join(SYSTEM_IPUS)} or a number of IPUs"
        )
    return SYSTEM_IPUS[key]


@dataclass(frozen=True)
class Candidate:
    """One way to run the step: mesh axes (name, size), phases, and for a pipeline its
    micro-batches (None: the workload's own) and recomputation (None: the workload's own)."""

    axes: tuple[tuple[str, int], ...]
    phases: str | None = None
    microbatches: int | None = None
    recompute: bool | None = None

    @property
    def mesh(self) -> dict[str, int]:
        return dict(self.axes)

    @property
    def pipelined(self) -> bool:
        return PIPELINE_AXIS in self.mesh

    def phased(self) -> Candidate:
        """The same plan run in phases the partitioner chooses."""
        return dataclasses.replace(self, phases="auto")

    def stashing(self, microbatches: int | None) -> Candidate:
        """The pipeline in `microbatches` micro-batches, stashing its activations."""
        return dataclasses.replace(self, microbatches=microbatches, recompute=False)

    def recomputing(self) -> Candidate:
        """The same pipeline recomputing its activations instead of stashing them."""
        return dataclasses.replace(self, recompute=True)

    def describe(self) -> str:
        text = ", ".join(f"{n}={s}" for n, s in self.axes)
        if self.phases:
            text += f", phases={self.phases}"
        if self.microbatches is not None:
            text += f", {self.microbatches} micro-batches"
        if self.recompute is not None:
            text += ", recompute" if self.recompute else ", no recompute"
        return text


def _factorisations(n: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every way to write n as an ordered product of `parts` positive factors."""
    if parts == 1:
        yield (n,)
        return
    for first in range(1, n + 1):
        if n % first == 0:
            for rest in _factorisations(n // first, parts - 1):
                yield (first, *rest)


def meshes(
    ipus: int, layouts: Sequence[tuple[str, ...]] = LAYOUTS
) -> list[tuple[tuple[str, int], ...]]:
    """Every mesh over all `ipus` IPUs in `layouts`: each axis but dp of size 2 or more (a
    size-1 axis is the layout without it), dp dropped at size 1 unless it is the only axis."""
    found: list[tuple[tuple[str, int], ...]] = []
    for names in layouts:
        for sizes in _factorisations(ipus, len(names)):
            if any(s < 2 for s in sizes[1:]):
                continue
            axes = tuple(
                (n, s) for n, s in zip(names, sizes, strict=True) if s > 1 or n != REPLICAS
            )
            axes = axes or ((REPLICAS, 1),)
            if axes not in found:
                found.append(axes)
    return found


def microbatch_counts(per_replica: int, stages: int) -> list[int | None]:
    """Micro-batch counts for a pipeline of `stages` stages and a fixed global batch: each
    replica's `per_replica` samples cut into micro-batches of `MICRO_BATCH_SIZES` samples, at
    least one per stage (None, the workload's own, when no size does)."""
    counts: list[int | None] = [
        per_replica // m
        for m in MICRO_BATCH_SIZES
        if per_replica % m == 0 and per_replica // m >= stages
    ]
    return counts or [None]

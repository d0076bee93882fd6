"""Collectives over IPU-Links: where a mesh axis sits among the physical IPUs, and what a ring
collective over it costs (docs/target.md, "IPU-Links and systems").

IPUs are numbered machine by machine (the system's machines, then its Pod64s), and a mesh lies
on them in its own order, the last axis varying fastest, as a `jax.sharding.Mesh` lies on its
devices: the mesh (dp, tp1, tp2) of Graphcore's GPT-3 on a Pod256 puts each tp2 group of 8 on
two neighbouring machines, each tp1 group of 8 at a stride of 8 inside a Pod64, and the 4 dp
replicas in the 4 Pod64s (docs/phases.md). A group of IPUs along some axes is a ring: within a
Pod64 over IPU-Links, beyond it over Gateway-Links.

Ring closed forms, per IPU, for an N-byte buffer (N the whole, gathered size) and n IPUs:
AllReduce sends 2 (n-1)/n N in 2 (n-1) steps; AllGather and ReduceScatter (n-1)/n N in n-1
steps; AllToAll (n-1)/n of its buffer in n-1 steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from lowering import COLLECTIVES, Graph, Op
from partitioner.cost.exchange import global_sync_cycles
from partitioner.mesh import System, system_for
from partitioner.target import Target


@dataclass(frozen=True, slots=True)
class CollectiveCost:
    """One collective over IPU-Links: its kind and axes, the bytes each IPU sends, its cycles
    (the ring and its group's sync), the op and line that needed it and why, and its route."""

    kind: str
    axes: tuple[str, ...]
    group_size: int
    bytes_per_ipu: int
    cycles: int
    op: str = ""
    source: str = ""
    why: str = ""


class Ring(NamedTuple):
    """A ring collective's figures: bytes each IPU sends, ring steps, cycles on the links, the
    group's sync cycles, and the links it crosses."""

    bytes_per_ipu: int
    steps: int
    link_cycles: int
    sync_cycles: int
    route: str


def ring_bytes(kind: str, buffer_bytes: int, group: int) -> tuple[int, int]:
    """(bytes each IPU sends, ring steps) for a collective over `group` IPUs.

    `buffer_bytes` is the operand for AllReduce and AllToAll, the gathered result for
    AllGather and the whole input for ReduceScatter (`collective_buffer`)."""
    if group <= 1:
        return 0, 0
    share = (group - 1) * buffer_bytes
    if kind == "all_reduce":
        return math.ceil(2 * share / group), 2 * (group - 1)
    return math.ceil(share / group), group - 1


def collective_buffer(op: Op) -> int:
    """The buffer the ring closed form of a collective op is stated for (see `ring_bytes`)."""
    if op.name == "all_gather":
        return op.results[0].nbytes
    return op.operands[0].nbytes


def axis_traffic(graph: Graph) -> dict[str, int]:
    """Bytes each mesh axis's collectives move per IPU in a per-IPU program."""
    traffic: dict[str, int] = {}
    for op in graph.ops:
        if op.name not in COLLECTIVES:
            continue
        sent, _ = ring_bytes(op.name, collective_buffer(op), op.attrs["group_size"])
        for axis in op.attrs["axes"]:
            traffic[axis] = traffic.get(axis, 0) + sent
    return traffic


def link_cycles(target: Target, bytes_per_ipu: float, steps: int, over_gateway: bool) -> int:
    """A ring collective: each IPU's bytes at its ring bandwidth, plus each step's latency."""
    if bytes_per_ipu <= 0:
        return 0
    if over_gateway:
        rate = target.gateway_bytes_per_second_per_ipu
    else:
        rate = target.ring_links * target.ipu_link_bytes_per_second * target.ipu_link_efficiency
    transfer = math.ceil(bytes_per_ipu * target.clock_hz / rate)
    return transfer + steps * target.ipu_link_latency_cycles


@dataclass(frozen=True, slots=True)
class LinkModel:
    """Mesh axes placed on the physical IPUs of a system, innermost (most traffic) first."""

    sizes: Mapping[str, int]
    placement: tuple[str, ...]  # innermost first
    target: Target
    system: System

    @classmethod
    def place(
        cls, sizes: Mapping[str, int], target: Target, system: System | None = None
    ) -> LinkModel:
        """The mesh in its own order, the last axis innermost; `system` defaults to the
        smallest that holds the mesh."""
        system = system or system_for(math.prod(sizes.values()))
        return cls(dict(sizes), tuple(reversed(list(sizes))), target, system)

    def stride(self, axis: str) -> int:
        inner = self.placement[: self.placement.index(axis)]
        return math.prod(self.sizes[a] for a in inner)

    def span(self, axes: Sequence[str]) -> int:
        """How many consecutive IPU numbers one group along `axes` covers."""
        return 1 + sum((self.sizes[a] - 1) * self.stride(a) for a in axes)

    def route(self, axes: Sequence[str]) -> str:
        span = self.span(axes)
        if span <= self.system.ipus_per_machine:
            return "IPU-Links within a machine"
        if span <= self.system.ipus_per_pod64:
            return "IPU-Links within a Pod64"
        return "Gateway-Links between Pod64s"

    def group(self, axes: Sequence[str]) -> int:
        return math.prod(self.sizes[a] for a in axes)

    def ring(self, kind: str, axes: Sequence[str], buffer_bytes: int) -> Ring:
        group = self.group(axes)
        sent, steps = ring_bytes(kind, buffer_bytes, group)
        route = self.route(axes)
        cycles = link_cycles(self.target, sent, steps, route.startswith("Gateway"))
        return Ring(sent, steps, cycles, global_sync_cycles(self.target, group), route)

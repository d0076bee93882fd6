"""Collectives over IPU-Links: where a mesh axis sits among the physical IPUs, and what a ring
collective over it costs (`shared/ipu_facts.md`, "Systems" and the ring closed forms).

IPUs are numbered machine by machine (4 per IPU-M2000 / Bow-2000, 64 per Pod64). Mesh axes are
placed so that the axis that moves the most bytes varies fastest, i.e. sits inside a machine and
crosses the fewest links; then come the others, by traffic. A group of IPUs along some axes is a
ring: within a Pod64 over IPU-Links, beyond it over Gateway-Links.

Ring closed forms, per IPU, for an N-byte buffer (N the whole, gathered size) and n IPUs:
AllReduce sends 2 (n-1)/n N in 2 (n-1) steps; AllGather and ReduceScatter (n-1)/n N in n-1
steps; AllToAll (n-1)/n of its buffer in n-1 steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from partitioner.target import Target

POD64 = 64
MACHINE = 4


@dataclass(frozen=True, slots=True)
class CollectiveCost:
    bytes_per_ipu: int
    steps: int
    link_cycles: int
    sync_cycles: int
    route: str


def ring_bytes(kind: str, buffer_bytes: int, group: int) -> tuple[int, int]:
    """(bytes each IPU sends, ring steps) for a collective over `group` IPUs.

    `buffer_bytes` is the operand for AllReduce and AllToAll, the gathered result for
    AllGather and the whole input for ReduceScatter."""
    if group <= 1:
        return 0, 0
    share = (group - 1) * buffer_bytes
    if kind == "all_reduce":
        return math.ceil(2 * share / group), 2 * (group - 1)
    return math.ceil(share / group), group - 1


@dataclass(frozen=True, slots=True)
class LinkModel:
    """Mesh axes placed on physical IPUs, innermost (most traffic) first."""

    sizes: Mapping[str, int]
    placement: tuple[str, ...]  # innermost first
    target: Target

    @classmethod
    def place(
        cls, sizes: Mapping[str, int], traffic: Mapping[str, int], target: Target
    ) -> LinkModel:
        order = sorted(sizes, key=lambda a: (-traffic.get(a, 0), list(sizes).index(a)))
        return cls(dict(sizes), tuple(order), target)

    def stride(self, axis: str) -> int:
        inner = self.placement[: self.placement.index(axis)]
        return math.prod(self.sizes[a] for a in inner)

    def span(self, axes: Sequence[str]) -> int:
        """How many consecutive IPU numbers one group along `axes` covers."""
        return 1 + sum((self.sizes[a] - 1) * self.stride(a) for a in axes)

    def route(self, axes: Sequence[str]) -> str:
        span = self.span(axes)
        if span <= MACHINE:
            return "IPU-Links within a machine"
        if span <= POD64:
            return "IPU-Links within a Pod64"
        return "Gateway-Links between Pod64s"

    def cost(self, kind: str, axes: Sequence[str], buffer_bytes: int) -> CollectiveCost:
        group = math.prod(self.sizes[a] for a in axes)
        sent, steps = ring_bytes(kind, buffer_bytes, group)
        route = self.route(axes)
        cycles = self.target.link_cycles(sent, steps, route.startswith("Gateway"))
        return CollectiveCost(sent, steps, cycles, self.target.global_sync_cycles(group), route)

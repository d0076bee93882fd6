"""Collectives over IPU-Links: where a mesh axis sits among the physical IPUs, and what a ring
collective over it costs (docs/target.md, "IPU-Links and systems").

IPUs are numbered machine by machine (the system's machines, then its Pod64s), and a mesh lies
on them in its own order, the last axis varying fastest, as a `jax.sharding.Mesh` lies on its
devices: the mesh (dp, tp1, tp2) of Graphcore's GPT-3 on a Pod256 puts each tp2 group of 8 on
two neighbouring machines, each tp1 group of 8 at a stride of 8 inside a Pod64, and the 4 dp
replicas in the 4 Pod64s (docs/phases.md). A group of IPUs along some axes is a ring, laid on
the system's links as GCL lays it (`topology`): inside a Pod64 over the IPU-Links its ring has
per hop in each direction, beyond it over the Gateway-Links of each IPU's machine.

Ring closed forms, per IPU, for an N-byte buffer (N the whole, gathered size) and n IPUs:
AllReduce sends 2 (n-1)/n N in 2 (n-1) steps; AllGather and ReduceScatter (n-1)/n N in n-1
steps; AllToAll (n-1)/n of its buffer in n-1 steps. The bytes are the same whatever the links;
the links set how fast they go: each IPU sends over its ring's links both ways round at once,
`2 x links per direction x 15.75 GB/s x 0.85`, or its share of its machine's two Gateway-Links,
`2 x 12.5 GB/s x 0.85 / 4`; every ring step adds a fixed latency.

A halo exchange is one step of such a ring in both directions at once: each IPU sends its edge
rows to its two neighbours along the group (the `before` rows one way, the `after` rows the
other), each way at half its ring's rate, and pays one step's latency (`LinkModel.halo`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from lowering import COLLECTIVES, Graph, Op
from partitioner.cost.exchange import global_sync_cycles
from partitioner.cost.topology import RingPath, ring_path
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
    buffer_bytes: int = 0  # what the ring reduces or gathers (`collective_buffer`), when known


class Ring(NamedTuple):
    """A ring collective's figures: bytes each IPU sends, ring steps, cycles on the links, the
    group's sync cycles, the links it crosses, and the IPU-Links per hop in each direction of
    its slowest hop (0 over Gateway-Links)."""

    bytes_per_ipu: int
    steps: int
    link_cycles: int
    sync_cycles: int
    route: str
    links_per_direction: float = 0.0


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
    return sum(x.nbytes for x in op.operands)  # an all-reduce's combined operands together


def halo_edges(op: Op) -> tuple[int, int]:
    """Bytes each IPU sends in a halo exchange: the last `before` rows of its block to the next
    IPU, and the first `after` rows to the previous one."""
    x = op.operands[0]
    row = x.nbytes // max(1, x.shape[op.attrs["dimension"]])
    return op.attrs["before"] * row, op.attrs["after"] * row


def axis_traffic(graph: Graph) -> dict[str, int]:
    """Bytes each mesh axis's collectives and halo exchanges move per IPU in a per-IPU
    program."""
    traffic: dict[str, int] = {}
    for op in graph.ops:
        if op.name == "halo_exchange":
            sent = sum(halo_edges(op))
        elif op.name == "collective_permute":
            sent = op.operands[0].nbytes
        elif op.name in COLLECTIVES:
            sent, _ = ring_bytes(op.name, collective_buffer(op), op.attrs["group_size"])
        else:
            continue
        for axis in op.attrs["axes"]:
            traffic[axis] = traffic.get(axis, 0) + sent
    return traffic


def ring_bytes_per_second(target: Target, system: System, path: RingPath) -> float:
    """What one IPU sends per second round its ring: over IPU-Links, the usable share of its
    ring's links both ways round; over Gateway-Links, its share of its machine's."""
    if path.over_gateway:
        machine = target.gateway_links_per_machine * target.gateway_link_bytes_per_second
        return machine * target.gateway_link_efficiency / system.ipus_per_machine
    both_ways = 2 * path.links_per_direction
    return both_ways * target.ipu_link_bytes_per_second * target.ipu_link_efficiency


def link_cycles(target: Target, bytes_per_ipu: float, steps: int, bytes_per_second: float) -> int:
    """A ring collective: each IPU's bytes at its ring's rate, plus each step's latency."""
    if bytes_per_ipu <= 0:
        return 0
    transfer = math.ceil(bytes_per_ipu * target.clock_hz / bytes_per_second)
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
        return self.path(axes).route

    def group(self, axes: Sequence[str]) -> int:
        return math.prod(self.sizes[a] for a in axes)

    def groups(self, axes: Sequence[str]) -> list[tuple[int, ...]]:
        """The IPU numbers of every group along `axes`, one tuple per group."""
        others = [a for a in self.placement if a not in axes]
        return [
            tuple(base + offset for offset in self._offsets(axes)) for base in self._offsets(others)
        ]

    def _offsets(self, axes: Sequence[str]) -> list[int]:
        offsets = [0]
        for axis in axes:
            step = self.stride(axis)
            offsets = [o + i * step for o in offsets for i in range(self.sizes[axis])]
        return offsets

    def path(self, axes: Sequence[str]) -> RingPath:
        """The slowest of the groups' rings along `axes`: they all run at once and the
        collective ends with the last."""
        sizes = tuple(self.sizes.items())
        return _slowest_path(sizes, self.placement, tuple(axes), self.target, self.system)

    def ring(self, kind: str, axes: Sequence[str], buffer_bytes: int) -> Ring:
        group = self.group(axes)
        sync = global_sync_cycles(self.target, group)
        levels = self.levels(axes) if kind in _HIERARCHICAL else None
        if levels is not None:
            return _hierarchical(self.target, self.system, kind, buffer_bytes, levels, sync)
        sent, steps = ring_bytes(kind, buffer_bytes, group)
        path = self.path(axes)
        rate = ring_bytes_per_second(self.target, self.system, path)
        cycles = link_cycles(self.target, sent, steps, rate)
        return Ring(sent, steps, cycles, sync, path.route, path.links_per_direction)

    def levels(self, axes: Sequence[str]) -> Levels | None:
        """A group spread over several Pod64s, with several IPUs in each, as GCL runs its
        collectives: rings inside each Pod64 and a ring of one IPU per Pod64 over the
        Gateway-Links; None for a group inside one Pod64 or of one IPU per Pod64."""
        sizes = tuple(self.sizes.items())
        return _levels(sizes, self.placement, tuple(axes), self.target, self.system)

    def halo(self, axes: Sequence[str], forward: int, backward: int) -> Ring:
        """A halo exchange along `axes`: `forward` bytes to the next IPU and `backward` to the
        previous, at once, each over one direction of the links the group's ring has (half
        its rate), in one step: the larger transfer plus one latency, and the group's sync."""
        path = self.path(axes)
        one_way = ring_bytes_per_second(self.target, self.system, path) / 2
        cycles = link_cycles(self.target, max(forward, backward), 1, one_way)
        sync = global_sync_cycles(self.target, self.group(axes))
        return Ring(forward + backward, 1, cycles, sync, path.route, path.links_per_direction)


class Levels(NamedTuple):
    """A group as GCL's hierarchy runs it: `inner` IPUs of it in each Pod64 on the slowest
    inner ring's `inner_path`, and `outer` Pod64s joined by `outer_path`."""

    inner: int
    outer: int
    inner_path: RingPath
    outer_path: RingPath


# Collectives GCL runs level by level across Pod64s (docs/target.md, "IPU-Links and systems").
_HIERARCHICAL = frozenset({"all_reduce", "reduce_scatter", "all_gather"})


@functools.lru_cache(maxsize=1024)
def _levels(
    sizes: tuple[tuple[str, int], ...],
    placement: tuple[str, ...],
    axes: tuple[str, ...],
    target: Target,
    system: System,
) -> Levels | None:
    """`LinkModel.levels`, kept per mesh and axes."""
    model = LinkModel(dict(sizes), placement, target, system)
    ipus = math.prod(size for _, size in sizes)
    per_pod = system.ipus_per_pod64
    groups = model.groups(axes)
    pods = {i // per_pod for i in groups[0]}
    inner = len(groups[0]) // len(pods)
    if len(pods) < 2 or inner < 2:
        return None
    parts = [[i for i in g if i // per_pod == p] for g in groups for p in {i // per_pod for i in g}]
    inner_paths = {ring_path(part, ipus, system, target) for part in parts}
    rate = functools.partial(ring_bytes_per_second, target, system)
    inner_path = min(inner_paths, key=lambda p: (rate(p), p.route))
    leaders = sorted({min(part): None for part in parts if min(part) in groups[0]})
    outer_path = ring_path([i for i in groups[0] if i in leaders], ipus, system, target)
    return Levels(inner, len(pods), inner_path, outer_path)


def _hierarchical(
    target: Target, system: System, kind: str, buffer: int, levels: Levels, sync: int
) -> Ring:
    """A collective level by level: an AllReduce reduce-scatters inside each Pod64, all-reduces
    its 1/inner shard across the Pod64s and all-gathers inside again; a ReduceScatter is the
    first two, an AllGather the outer gather of the shards then the inner one. Each level's
    ring at its own rate and with its own steps' latency."""
    inner, outer = (levels.inner, levels.inner_path), (levels.outer, levels.outer_path)
    shard = math.ceil(buffer / levels.inner)
    stages = {
        "all_reduce": [
            ("reduce_scatter", buffer, inner),
            ("all_reduce", shard, outer),
            ("all_gather", buffer, inner),
        ],
        "reduce_scatter": [("reduce_scatter", buffer, inner), ("reduce_scatter", shard, outer)],
        "all_gather": [("all_gather", shard, outer), ("all_gather", buffer, inner)],
    }[kind]
    sent = steps = cycles = 0
    for stage, size, (count, path) in stages:
        stage_sent, stage_steps = ring_bytes(stage, size, count)
        rate = ring_bytes_per_second(target, system, path)
        sent, steps = sent + stage_sent, steps + stage_steps
        cycles += link_cycles(target, stage_sent, stage_steps, rate)
    route = f"{levels.inner_path.route}, then {levels.outer_path.route}"
    return Ring(sent, steps, cycles, sync, route, levels.inner_path.links_per_direction)


@functools.lru_cache(maxsize=1024)
def _slowest_path(
    sizes: tuple[tuple[str, int], ...],
    placement: tuple[str, ...],
    axes: tuple[str, ...],
    target: Target,
    system: System,
) -> RingPath:
    """`LinkModel.path`, kept per mesh and axes: a program has many collectives over few."""
    model = LinkModel(dict(sizes), placement, target, system)
    ipus = math.prod(size for _, size in sizes)
    paths = {ring_path(g, ipus, system, target) for g in model.groups(axes)}
    return min(paths, key=lambda p: (ring_bytes_per_second(target, system, p), p.route))

"""Which links a group's ring collective runs over, read from the system's topology
(docs/target.md, "IPU-Links and systems").

The topology. A machine's four IPUs are two pairs: `rung_links` join the two IPUs of a pair
(0-1, 2-3) and `cross_links` join the pairs (0-2, 1-3), so a machine is a ladder of two rungs,
and a ring 0-1-3-2. Machines stack in a column: `column_links` join each IPU to the same IPU of
the machine above and to that of the machine below. These are the per-IPU counts of Poplar's
IPU Model (4 links to the card partner, 2 cross, 2 up, 2 down: the chip's 10 IPU-Links). A
Pod16's column of 4 machines is open, a ladder; a Pod64's column of 16 closes into a ring, which
makes the Pod64 a 4 x 16 2D torus. Pod64s are joined by Gateway-Links.

The rings. GCL sends half of a collective's data each way round a ring (its bidirectional ring
pair), and its quad-directional ring runs two such rings on separate links, so a ring uses at
most `collective_rings` links per hop in each direction. A ring is as fast as its slowest hop:
that hop's links in one direction over the ring streams that share them. The groups along a
mesh axis all run at once, so groups interleaved on a column share its links. A ring that cannot
come back another way comes back over the links it went out on, which halves them for each
direction; a ring through a block of machines (up one column, down another) or round a Pod64's
closed column does not.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from partitioner.mesh import System
from partitioner.target import Target

WITHIN_MACHINE = "IPU-Links within a machine"
WITHIN_POD16 = "IPU-Links within a Pod16"
WITHIN_POD64 = "IPU-Links within a Pod64"
BETWEEN_POD64S = "Gateway-Links between Pod64s"


@dataclass(frozen=True, slots=True)
class RingPath:
    """Where a group's ring runs: its route, and the IPU-Links each direction of the ring has
    on its slowest hop (a fraction where groups share them; 0 over Gateway-Links)."""

    route: str
    links_per_direction: float

    @property
    def over_gateway(self) -> bool:
        return self.route == BETWEEN_POD64S


@dataclass(frozen=True, slots=True)
class _Footprint:
    """A group's IPUs as positions inside their machines and rows of their Pod64's column."""

    size: int
    positions: frozenset[int]
    rows: tuple[int, ...]  # sorted
    pods: int

    @property
    def block(self) -> bool:
        """Whole positions over whole rows: the ring goes up one column and down another, and
        closes without going back over its own links."""
        p, r = len(self.positions), len(self.rows)
        return p > 1 and r > 1 and self.size == p * r > 2

    @property
    def round_the_machine(self) -> bool:
        """The ring never comes back over a machine hop it went out on: it goes round the
        machine's ring 0-1-3-2 (more than two positions) or through a block."""
        whole = self.size == len(self.positions) * len(self.rows)
        return whole and (len(self.positions) > 2 or self.block)

    @property
    def row_stride(self) -> int:
        return functools.reduce(math.gcd, (b - self.rows[0] for b in self.rows[1:]), 0)


def ring_path(ipus: Sequence[int], mesh_ipus: int, system: System, target: Target) -> RingPath:
    """The route and links per hop and direction of the ring over `ipus`, one of the groups
    along some mesh axes of a mesh on `mesh_ipus` IPUs of `system`."""
    where = _footprint(ipus, system)
    if where.pods > 1:
        return RingPath(BETWEEN_POD64S, 0.0)
    share = min(
        float(target.collective_rings),
        _machine_share(where, target),
        _column_share(where, _mesh_rows(mesh_ipus, system), system, target),
    )
    route = WITHIN_MACHINE if len(where.rows) == 1 else _pod_route(system)
    return RingPath(route, share)


def _footprint(ipus: Sequence[int], system: System) -> _Footprint:
    per_machine, per_pod = system.ipus_per_machine, system.ipus_per_pod64
    return _Footprint(
        size=len(ipus),
        positions=frozenset(i % per_machine for i in ipus),
        rows=tuple(sorted({i % per_pod // per_machine for i in ipus})),
        pods=len({i // per_pod for i in ipus}),
    )


def _mesh_rows(mesh_ipus: int, system: System) -> int:
    """The rows of a Pod64's column the mesh occupies."""
    return math.ceil(min(mesh_ipus, system.ipus_per_pod64) / system.ipus_per_machine)


def _pod_route(system: System) -> str:
    return WITHIN_POD64 if system.torus else WITHIN_POD16


def _machine_share(where: _Footprint, target: Target) -> float:
    """Links per direction on the group's slowest hop inside a machine: a pair's rung, else a
    cross link; halved when the ring comes back over the hop it went out on (two positions
    alone, as in a group of two)."""
    if len(where.positions) < 2:
        return math.inf
    links = target.rung_links if _is_pair(where.positions) else target.cross_links
    return links if where.round_the_machine else links / 2


def _is_pair(positions: frozenset[int]) -> bool:
    low, high = min(positions), max(positions)
    return len(positions) == 2 and low % 2 == 0 and high == low + 1


def _column_share(where: _Footprint, mesh_rows: int, system: System, target: Target) -> float:
    """Links per direction on the group's slowest hop up or down the column. The groups
    interleaved on a column (`row_stride` of them) share each link; a ring that goes back down
    the way it came up shares them with itself, unless a closed column lets every ring on it
    go round once instead (each link then carries one stream of every group on the column)."""
    if len(where.rows) < 2:
        return math.inf
    if where.block:
        sharing = float(where.row_stride)
    else:
        sharing = 2.0 * where.row_stride
        if system.torus:
            sharing = min(sharing, mesh_rows / len(where.rows))
    return target.column_links / sharing

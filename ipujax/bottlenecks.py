"""What bounds each superstep: the resource its longest part waits on (compute, exchange, sync,
links, streaming, host), and the step's cycles by what bounds them. A superstep runs its parts
one after another (Poplar's BSP: sync, exchange, compute; a collective's ring over the links),
so the longest part is the one a faster machine would have to shorten first.

The bounds are derived from the report's records (`bounds` of its supersteps, the execution
tables, the JSON's `bounds`), never stored: a report read back has them too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from partitioner import Superstep

COMPUTE, EXCHANGE, SYNC, LINKS, STREAMING, HOST = (
    "compute",
    "exchange",
    "sync",
    "links",
    "streaming",
    "host",
)
BOUNDS = (COMPUTE, EXCHANGE, SYNC, LINKS, STREAMING, HOST)
IDLE = "nothing"  # a superstep of no cycles

# A superstep's link cycles by its kind: a collective's ring or a pipeline's sends run over
# the IPU-Links; a phase's streaming over the gateway; a host transfer over the host's link.
LINK_BOUND = {"stream": STREAMING, "host": HOST}


def bound(step: Superstep) -> str:
    """The resource the longest part of `step` waits on (the first of `BOUNDS` on a tie)."""
    parts = {
        COMPUTE: step.compute_cycles,
        EXCHANGE: step.exchange_cycles,
        SYNC: step.sync_cycles,
        LINK_BOUND.get(step.kind, LINKS): step.link_cycles,
    }
    if step.kind == "host":  # a host transfer's latency and bytes are one wait
        parts = {HOST: step.cycles}
    most = max(parts.values())
    if most <= 0:
        return IDLE
    return next(b for b in BOUNDS if parts.get(b) == most)


def bounds(supersteps: Iterable[Superstep]) -> tuple[str, ...]:
    """Each superstep's bound, in order."""
    return tuple(bound(s) for s in supersteps)


@dataclass(frozen=True, slots=True)
class BoundTotal:
    """The supersteps a resource bounds: how many, their cycles, and the costliest."""

    bound: str
    steps: int
    cycles: int
    costliest: str  # the name of the longest superstep it bounds


def bound_totals(supersteps: Sequence[Superstep]) -> list[BoundTotal]:
    """Each resource that bounds a superstep, with their cycles, most cycles first."""
    found: dict[str, list[Superstep]] = {}
    for step in supersteps:
        found.setdefault(bound(step), []).append(step)
    totals = [
        BoundTotal(b, len(steps), sum(s.cycles for s in steps), max(steps, key=_cycles).name)
        for b, steps in found.items()
        if b != IDLE
    ]
    return sorted(totals, key=lambda x: (-x.cycles, BOUNDS.index(x.bound)))


def _cycles(step: Superstep) -> int:
    return step.cycles

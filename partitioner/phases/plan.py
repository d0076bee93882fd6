"""The `phases=` setting's type, and a phase plan: the phases' names and task bounds, the record
every way of splitting a program into phases produces (`scopes`, `cuts`, `split`).
"""

from __future__ import annotations

from dataclasses import dataclass

from partitioner.memory.liveness import PhaseBounds
from partitioner.phases.loops import LoopSpan

# None (one program on chip), "auto" (the program's own blocks), or `jax.named_scope` names.
Phases = str | tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class PhasePlan:
    names: tuple[str, ...]
    bounds: PhaseBounds
    loops: tuple[LoopSpan, ...] = ()  # counted loops laid out inline, run phase-major

"""Loops whose cost rests on an assumption, told before and after a run: the compile's
warnings, the report's caveats, and the step re-costed with the trips a run counted.

A `while` whose trips only a run knows is charged one trip until the program has run; then the
runtime has counted its trips (`runtime/trips.py`) and the report charges them
(`partitioner.counted_cost`). A counted loop past the unroll limit of a pipeline, or one a phased
program cannot run phase-major, stays one loop, and what that costs is said where it happens.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

from ipujax.errors import LoopTripsWarning, UnrollLimitWarning
from lowering import Op, Value, producers, shorten_paths
from partitioner import (
    Built,
    OpenLoop,
    counted_cost,
    limited_loops,
    open_loops,
    unfissioned_loops,
)


@dataclass(frozen=True)
class Loops:
    """A compiled program's loops of unknown trips (`open`), its counted loops left whole (at
    the unroll limit when pipelined; phased, those phases cannot run phase-major) with why
    (`limited`), what leaving one whole means here (`whole`) and what the user can do
    (`remedy`)."""

    open: tuple[OpenLoop, ...] = ()
    limited: tuple[tuple[Op, str], ...] = ()
    whole: str = ""
    remedy: str = ""
    counts: bool = True  # whether a run's trips re-cost the step (not when pipelined)

    @property
    def counted(self) -> tuple[Value, ...]:
        """The loops the runtime counts: those the step runs itself, by their first result."""
        return tuple(loop.key for loop in self.open if loop.top) if self.counts else ()


def find_loops(built: Built) -> Loops:
    """The loops of `built` whose cost rests on an assumption."""
    made = producers(built.graph)
    limited: tuple[tuple[Op, str], ...] = ()
    if built.pipeline is not None:
        limited = limited_loops(built.program, made)
    elif built.plan is not None:
        limited = unfissioned_loops(built.program, made)
    whole, remedy = _whole(built)
    open_ = open_loops(built.program, made)
    return Loops(open_, limited, whole, remedy, built.pipeline is None)


def _whole(built: Built) -> tuple[str, str]:
    """What a loop left whole does here, and what the user can do about it."""
    if built.pipeline is not None:
        return (
            "it runs whole within one pipeline stage",
            "shorten the loop or split it into loops within the limit",
        )
    return (
        "phases cannot cut inside it: all its trips run in one phase",
        "keep each value the loop carries within one block (one jax.named_scope) of its body",
    )


def where(op: Op) -> str:
    """`while loop at examples/f.py:12`, the user's line as the report names it."""
    return f"while loop at {shorten_paths(str(op.loc))}"


def caveats(loops: Loops, trips: Mapping[Value, int]) -> tuple[str, ...]:
    """One line per loop whose cost rests on an assumption; `trips`: those a run counted."""
    lines = [_open_caveat(loop, loops.counts, trips) for loop in loops.open]
    lines += [f"{where(op)}: {why}: {loops.whole}" for op, why in loops.limited]
    return tuple(lines)


def _open_caveat(loop: OpenLoop, counts: bool, trips: Mapping[Value, int]) -> str:
    if loop.key in trips:
        return f"{where(loop.op)}: {trips[loop.key]:,} trips, counted in the last run"
    unknown = f"{where(loop.op)}: trips known only at run time; its cost assumes one trip"
    if not loop.top:
        return f"{unknown} each time the loop or branch around it runs, even after a run"
    if not counts:
        return f"{unknown} (a pipelined step is not re-costed from a run)"
    return f"{unknown} until the program has run"


def recosted(built: Built, trips: Mapping[Value, int]) -> Built:
    """`built` with its step cost charging the counted `trips`; nothing else rebuilt."""
    return dataclasses.replace(built, cost=counted_cost(built, trips))


def warn_loops(loops: Loops) -> None:
    """One warning per compile for loops of unknown trips, and one for loops left whole at the
    unroll limit."""
    _warn(
        [where(loop.op) for loop in loops.open],
        "its trips are known only at run time, so its cost assumes one trip until the program "
        "has run, then charges the trips the last run counted (Compiled.cost_report(); its "
        "caveats list every such loop)",
        LoopTripsWarning,
    )
    _warn(
        [f"{where(op)}: {why}" for op, why in loops.limited],
        f"{loops.whole}; {loops.remedy}",
        UnrollLimitWarning,
    )


def _warn(named: list[str], meaning: str, category: type[Warning]) -> None:
    if not named:
        return
    more = f" (and {len(named) - 1} more)" if len(named) > 1 else ""
    # The caller of compile(), past `warn_loops`, `stages._warn`, `Lowered.compile` and the
    # API boundary.
    warnings.warn(f"{named[0]}{more}: {meaning}", category, stacklevel=6)

"""Loops whose cost rests on an assumption, told before and after a run: the compile's
warnings, the report's caveats, and the step re-costed with the trips a run counted.

A `while` whose trips only a run knows is charged one trip until the program has run; then the
runtime has counted its trips (`runtime/trips.py`) and the report charges them
(`partitioner.counted_cost`). A counted loop past the unroll limit, where loops are unrolled (many
IPUs, phases, a pipeline), stays one loop, and what that costs is said where it happens.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

from ipujax.errors import LoopTripsWarning, UnrollLimitWarning
from lowering import Op, Value, producers, shorten_paths
from partitioner import Built, OpenLoop, counted_cost, limited_loops, open_loops


@dataclass(frozen=True)
class Loops:
    """A compiled program's loops of unknown trips (`open`), its counted loops left whole at
    the unroll limit with why (`limited`), and what leaving one whole means here (`whole`)."""

    open: tuple[OpenLoop, ...] = ()
    limited: tuple[tuple[Op, str], ...] = ()
    whole: str = ""
    counts: bool = True  # whether a run's trips re-cost the step (not when pipelined)

    @property
    def counted(self) -> tuple[Value, ...]:
        """The loops the runtime counts: those the step runs itself, by their first result."""
        return tuple(loop.key for loop in self.open if loop.top) if self.counts else ()


def find_loops(built: Built) -> Loops:
    """The loops of `built` whose cost rests on an assumption."""
    made = producers(built.graph)
    unrolled = built.mesh.ipus > 1 or built.plan is not None or built.pipeline is not None
    limited = limited_loops(built.program, made) if unrolled else ()
    return Loops(open_loops(built.program, made), limited, _whole(built), built.pipeline is None)


def _whole(built: Built) -> str:
    """What a loop left whole does here, where loops are unrolled."""
    if built.pipeline is not None:
        return "it runs whole within one pipeline stage"
    on_every_ipu = "it runs whole on every IPU (a loop has no rule to run split)"
    if built.plan is None:
        return on_every_ipu
    if built.mesh.ipus == 1:
        return "phases cannot cut inside it: all its trips run in one phase"
    return f"phases cannot cut inside it, and {on_every_ipu}"


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


def warn_loops(loops: Loops, told: frozenset[str] = frozenset()) -> None:
    """One warning per compile for loops of unknown trips, and one for loops left whole at the
    unroll limit that no other warning (`told`: their sources) has named."""
    _warn(
        [where(loop.op) for loop in loops.open],
        "its trips are known only at run time, so its cost assumes one trip until the program "
        "has run, then charges the trips the last run counted (Compiled.cost_report(); its "
        "caveats list every such loop)",
        LoopTripsWarning,
    )
    untold = [(op, why) for op, why in loops.limited if str(op.loc) not in told]
    _warn(
        [f"{where(op)}: {why}" for op, why in untold],
        f"{loops.whole}; shorten the loop or split it into loops within the limit",
        UnrollLimitWarning,
    )


def _warn(named: list[str], meaning: str, category: type[Warning]) -> None:
    if not named:
        return
    more = f" (and {len(named) - 1} more)" if len(named) > 1 else ""
    # The caller of compile(), past `warn_loops`, `stages._warn`, `Lowered.compile` and the
    # API boundary.
    warnings.warn(f"{named[0]}{more}: {meaning}", category, stacklevel=6)

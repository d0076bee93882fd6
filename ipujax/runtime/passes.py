"""The runtime's passes, in order, in one place: rewrites of the per-IPU program that change how
the simulator computes its values on the CPU, never what the IPU is charged, and never what the
values are but in the order of their additions (jax.jit's under `numerics="exact"`) or under
`numerics="ipu"`, where the last rounds as the IPU would.

    whole_sums     (numerics "exact" only) each reduction, alone or ending a fused chain, runs
                   as the op itself, adding in XLA's order as jax.jit does, not in the order
                   its split over tiles adds (`whole_sums`)
    fuse_sums      (IPUs held on one device) an all-reduce of a contraction runs as one
                   contraction of every IPU's operands laid end to end (`fused_sums`)
    pass_scalars   a broadcast scalar read by a binary op or a comparison is handed to it as
                   the scalar; broadcasts nothing reads any more are dropped (`scalar_operands`)
    round_stochastically  (numerics "ipu" only) float16 results of the ops an IPU rounds
                   stochastically computed in float32 and so rounded (`stochastic`); with it,
                   fuse_sums stays off, so each IPU rounds its own contraction as it would

The cost report is built from the partitioner's program before these run; each pass is a pure
function from a `Program` to a `Program`, and with `verify` each result is checked to read every
value after it is made (`partitioner.verify_dataflow`; a rewrite may hand an op a scalar where
the tiles hold its broadcast, so the layouts are not the runtime's to keep).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from ipujax.runtime.fused_sums import fuse_sums
from ipujax.runtime.scalar_operands import pass_scalars
from ipujax.runtime.stochastic import round_stochastically
from ipujax.runtime.whole_sums import whole_sums
from lowering import Value
from partitioner import Program, verify_dataflow


@dataclass(frozen=True)
class Placement:
    """What the rewrites may know of where the program runs: the mesh's axes and sizes, the
    axes whose IPUs one device holds, and the mesh axes each value differs over."""

    sizes: Mapping[str, int]
    local_axes: Collection[str] = ()
    varying: Mapping[Value, frozenset[str]] | None = None
    numerics: str = "exact"  # "ipu": the IPU's stochastic rounding (`stochastic`)


def _whole_sums(program: Program, placement: Placement) -> Program:
    return whole_sums(program) if placement.numerics == "exact" else program


def _fuse_sums(program: Program, placement: Placement) -> Program:
    if not placement.local_axes or placement.varying is None or placement.numerics != "exact":
        return program
    return fuse_sums(program, placement.varying, placement.local_axes)


def _pass_scalars(program: Program, placement: Placement) -> Program:
    return pass_scalars(program)


def _round_stochastically(program: Program, placement: Placement) -> Program:
    if placement.numerics == "exact":
        return program
    return round_stochastically(program, placement.varying, tuple(placement.sizes))


RUNTIME_PASSES: tuple[tuple[str, Callable[[Program, Placement], Program]], ...] = (
    ("whole_sums", _whole_sums),
    ("fuse_sums", _fuse_sums),
    ("pass_scalars", _pass_scalars),
    ("round_stochastically", _round_stochastically),
)


def prepare(program: Program, placement: Placement, verify: bool = False) -> Program:
    """`program` through every runtime pass in order, each result verified when `verify`."""
    for name, rewrite in RUNTIME_PASSES:
        program = rewrite(program, placement)
        if verify:
            verify_dataflow(program, f"runtime {name}")
    return program

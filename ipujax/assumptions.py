"""What a step's cost assumes where no published figure checks it, one caveat line each
(`CostReport.caveats`), naming the first source line that leans on it.

A cost term the step spends cycles on (`ipujax.terms`) whose error band is the default (no
fidelity row checks it: `ipujax.bands`) is said with the assumptions of docs/target.md behind
it, marked (A) there: a ring within one machine, halo exchanges. A term a row checks carries
its error in the report's `seconds_range` instead. Ops whose cost is an assumption no row
checks (integer matmuls) are said by op. Collectives across Pod64s and ops gathered whole
have caveats of their own (`ipujax.caveats`), as have loops (`ipujax.loops`) and host
transfers (`ipujax.report_io`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ipujax import terms as t
from ipujax.bands import band
from lowering import CONTRACTIONS, Op, shorten_paths, walk
from partitioner import Built

_RING = "rings as docs/target.md assumes them (A), 'How a group's ring uses the links'"

# Each term: what its cost assumes, short (docs/target.md says the rest), said when the step
# spends cycles on it and no fidelity row checks it (its band is the default: `ipujax.bands`).
ASSUMED: dict[str, str] = {
    t.MATMUL: "PopLibs' estimators (docs/target.md, 'Matmuls on the AMP')",
    t.VECTOR: "PopLibs' estimators (docs/target.md, 'Vector work')",
    t.COPIES: "PopLibs' estimators, single bytes assumed (A) (docs/target.md, 'On-tile copies')",
    t.STAGES: "as docs/target.md assumes them (A), 'Pipelining'",
    t.EXCHANGE: "4 bytes a cycle per tile (docs/target.md, 'Exchange and sync')",
    t.SYNC: "PopLibs' sync cycles (docs/target.md, 'Exchange and sync')",
    t.MACHINE: _RING,
    t.POD16: _RING,
    t.POD64: _RING,
    t.ACROSS_POD64S: "level by level as docs/target.md assumes (A), 'Across Pod64s'",
    t.HALOS: "one ring step each way, as docs/target.md assumes (A), 'Halos across IPUs'",
    t.SENDS: "pipeline cycles as docs/target.md assumes them (A), 'Pipelining'",
    t.STREAMING: "at the PCIe link's rate, an upper bound docs/target.md assumes (A)",
    t.HOST: "overlapped as docs/target.md assumes (A), 'Host transfers overlapped with compute'",
}


def _integer_matmul(op: Op) -> bool:
    return op.name in CONTRACTIONS and not np.issubdtype(op.operands[0].dtype, np.floating)


# op -> (does this op lean on it, what, the assumption)
BY_OP: dict[str, tuple[Callable[[Op], bool], str, str]] = {
    "dot_general": (
        _integer_matmul,
        "integer matmuls",
        "a multiply and an add per product on the vector path, as docs/target.md assumes (A), "
        "'Matmuls on the AMP'",
    ),
}


def assumption_caveats(built: Built) -> list[str]:
    """One line per assumption the step leans on, naming where it first does."""
    cost = built.cost
    cycles = t.term_cycles(cost.supersteps, cost.collectives)
    sources = t.first_sources(cost.supersteps, cost.collectives)
    lines = [
        _line(term, *sources.get(term, ("", 0)), f"no fidelity row checks them; {why}")
        for term, why in ASSUMED.items()
        if cycles.get(term) and band(term).default
    ]
    return lines + _op_caveats(built)


def _op_caveats(built: Built) -> list[str]:
    found: dict[str, list[Op]] = {}
    for op in walk(built.graph):
        rule = BY_OP.get(op.name)
        if rule is not None and rule[0](op):
            found.setdefault(op.name, []).append(op)
    return [
        _line(BY_OP[name][1], str(ops[0].loc), len(ops), BY_OP[name][2])
        for name, ops in found.items()
    ]


def _line(what: str, source: str, count: int, why: str) -> str:
    where = f"{count:,}, first at {shorten_paths(source)}" if source else "no line"
    return f"{what} ({where}): {why}"

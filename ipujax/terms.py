"""The step's cost terms: its cycles split by the part of the cost model that charged them
(matmul and vector vertices, copies, exchange, syncs, collectives by the links they run over,
halo exchanges, pipeline sends, streaming, the host). A term is what a fidelity row can check
(`ipujax.band_evidence`), what carries an error band (`ipujax.bands`) and what an assumption of
docs/target.md rests on (`ipujax.assumptions`).

Reads only the superstep and collective records, so it serves a compiled `Built` and a
`CostReport` read back from JSON alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from partitioner import CollectiveCost, Superstep, per_record

MATMUL = "matmul vertices"
VECTOR = "vector vertices"
COPIES = "on-tile copies"
EXCHANGE = "on-chip exchange"
SYNC = "syncs"
MACHINE = "collectives within a machine"
POD16 = "collectives within a Pod16"
POD64 = "collectives within a Pod64"
ACROSS_POD64S = "collectives across Pod64s"
HALOS = "halo exchanges"
STAGES = "pipeline stages' compute"  # a pipelined step's work, its vertices not told apart
SENDS = "sends between pipeline stages"
STREAMING = "streaming memory"
HOST = "host transfers"
# Not a part of the step's seconds: its bytes, and the step on a system as a whole.
MEMORY = "tile memory"
SYSTEM = "a whole system's step"

# The terms a step's seconds split into, in the order the tables list them.
TIME_TERMS = (
    MATMUL,
    VECTOR,
    COPIES,
    STAGES,
    EXCHANGE,
    SYNC,
    MACHINE,
    POD16,
    POD64,
    ACROSS_POD64S,
    HALOS,
    SENDS,
    STREAMING,
    HOST,
)

# A collective's route (the end of its `why`, `partitioner.cost.topology`) -> its term; the
# first that matches: a route across Pod64s names the Pod64's IPU-Links too.
ROUTE_TERMS = (
    ("Gateway-Links", ACROSS_POD64S),
    ("within a Pod64", POD64),
    ("within a Pod16", POD16),
    ("within a machine", MACHINE),
)
MATMUL_STEP = ".matmul"  # the AMP or MAC vertex's compute set: `<op>.matmul` (tiles/rules)


def route_term(route: str) -> str:
    """The term of a collective over `route` (the end of its reason, after '; over ')."""
    for part, term in ROUTE_TERMS:
        if part in route:
            return term
    return MACHINE  # a route the topology does not name: the nearest links


def term_cycles(
    supersteps: Iterable[Superstep], collectives: Sequence[CollectiveCost]
) -> dict[str, float]:
    """Each term's cycles in the step (absent: none). A collective step's link and sync cycles
    go to the terms of the collectives' routes in proportion to their cycles (a loop's steps
    repeat a collective the records list once)."""
    cycles = dict.fromkeys(TIME_TERMS, 0.0)
    collective = 0
    for step in supersteps:
        _add_step(cycles, step)
        if step.kind == "collective":
            collective += step.link_cycles + step.sync_cycles
    for term, share in _route_shares(collectives).items():
        cycles[term] += collective * share
    return {term: c for term, c in cycles.items() if c > 0}


def _add_step(cycles: dict[str, float], step: Superstep) -> None:
    """The superstep's cycles but a collective's links and group sync, by term."""
    cycles[_compute_term(step)] += step.compute_cycles
    cycles[EXCHANGE] += step.exchange_cycles
    if step.kind == "collective":
        return
    if step.kind == "host":
        cycles[HOST] += step.link_cycles + step.sync_cycles
    elif step.kind == "stream":
        cycles[STREAMING] += step.link_cycles
        cycles[SYNC] += step.sync_cycles
    else:
        cycles[SENDS] += step.link_cycles  # a pipeline's sends (other kinds have none)
        cycles[SYNC] += step.sync_cycles


def _compute_term(step: Superstep) -> str:
    if step.kind == "copy":
        return COPIES
    if step.kind == "pipeline":
        return STAGES
    return MATMUL if step.name.endswith(MATMUL_STEP) else VECTOR


def _route_shares(collectives: Sequence[CollectiveCost]) -> dict[str, float]:
    """Each collective term's share of the records' cycles; no records: one term, the
    machine's links."""
    found: dict[str, float] = {}
    for c in collectives:
        term = HALOS if c.kind == "halo_exchange" else route_term(_route(c.why))
        found[term] = found.get(term, 0.0) + max(c.cycles, 1)
    total = sum(found.values())
    return {t: c / total for t, c in found.items()} if total else {MACHINE: 1.0}


def _route(why: str) -> str:
    return why.rsplit("; over ", 1)[-1] if "; over " in why else why


def first_sources(
    supersteps: Iterable[Superstep], collectives: Sequence[CollectiveCost]
) -> dict[str, tuple[str, int]]:
    """Each term's first source line and how many supersteps (or collectives) it spans."""
    found: dict[str, tuple[str, int]] = {}
    steps = list(supersteps)
    for step, terms in zip(steps, per_record(steps, step_terms), strict=True):
        for term in terms:
            source, count = found.get(term, (step.source, 0))
            found[term] = (source or step.source, count + 1)
    for c in collectives:
        term = HALOS if c.kind == "halo_exchange" else route_term(_route(c.why))
        source, count = found.get(term, (c.source, 0))
        found[term] = (source or c.source, count + 1)
    return found


def step_terms(step: Superstep) -> tuple[str, ...]:
    """The terms a superstep (not a collective's links) charges."""
    cycles = dict.fromkeys(TIME_TERMS, 0.0)
    _add_step(cycles, step)
    return tuple(t for t, c in cycles.items() if c > 0)

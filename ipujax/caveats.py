"""What a cost report's figures stand on that no published figure checks, said in its caveats
(`CostReport.caveats`): ops that gathered a split tensor to run whole on every IPU, a system
larger than any the fidelity table (docs/fidelity.md) covers, and collectives across Pod64s,
which rest on an assumption of how GCL runs them; and the assumptions of docs/target.md behind
the cost terms no fidelity row checks (`ipujax.assumptions`). Loops whose cost rests on an
assumption say so too (`ipujax.loops`).
"""

from __future__ import annotations

from ipujax.assumptions import assumption_caveats
from ipujax.host_bound import argument_name
from ipujax.loops import Loops
from lowering import shorten_paths
from partitioner import Built, kept_arguments

# The most IPUs a row of docs/fidelity.md runs on (ResNet-50 on a Bow Pod256); a test holds it
# to `ipujax.fidelity.FIGURES`.
VALIDATED_IPUS = 256
SHOWN_WHOLE = 5  # ops gathered whole named one by one; the rest counted


def standing_caveats(built: Built, loops: Loops) -> tuple[str, ...]:
    """The caveats of `built` that no run changes; `loops` say their own."""
    return (
        *_gathered_whole(built, loops),
        *_beyond_validation(built),
        *_across_pod64s(built),
        *_kept_state(built),
        *assumption_caveats(built),
    )


def _gathered_whole(built: Built, loops: Loops) -> list[str]:
    forced = built.partitioned.forced_whole if built.partitioned is not None else ()
    # A loop left whole at the unroll limit has a caveat of its own.
    looped = {str(op.loc) for op, _ in loops.limited}
    named = [f for f in forced if f.source not in looped]
    lines = [
        f"{f.op} at {shorten_paths(f.source)} runs whole on every IPU ({f.rule} rule): it "
        f"gathered {shorten_paths(f.tensor)}, and each IPU is charged the whole op"
        for f in named[:SHOWN_WHOLE]
    ]
    if len(named) > SHOWN_WHOLE:
        lines.append(f"{len(named) - SHOWN_WHOLE} more ops run whole on every IPU")
    return lines


def _kept_state(built: Built) -> list[str]:
    """The arguments the step returns updated, which the host figures take as kept on the
    IPUs between calls: said, since a function that merely returns something of an
    argument's structure and types is read the same way (one line: a report fits a screen)."""
    graph = built.partitioned.global_graph if built.partitioned is not None else built.graph
    names = [argument_name(graph, flat)[0] for flat in kept_arguments(graph) if flat]
    if not names:
        return []
    return [f"{', '.join(names)} returned updated: taken as kept on the IPUs, no host transfer"]


def _beyond_validation(built: Built) -> list[str]:
    ipus = built.mesh.ipus
    if ipus <= VALIDATED_IPUS:
        return []
    return [
        f"a system of {ipus:,} IPUs: no published figure checks one larger than "
        f"{VALIDATED_IPUS} IPUs (docs/fidelity.md); its collectives across Pod64s are modelled, "
        "not validated"
    ]


def _across_pod64s(built: Built) -> list[str]:
    system = built.mesh.system
    if built.mesh.ipus <= system.ipus_per_pod64:
        return []
    return [
        f"a system of {built.mesh.ipus:,} IPUs over {built.mesh.ipus // system.ipus_per_pod64} "
        "Pod64s: its collectives across them run level by level, as GCL is assumed to run them "
        "(docs/target.md, 'IPU-Links and systems'); Graphcore's ResNet-50 lost more throughput "
        "per IPU on a Pod256 than this model predicts (docs/fidelity.md)"
    ]

"""The host-bound warning: once per compile, when a step is mostly host transfers and sends a
large argument on every call, name the arguments and the fix (resident arguments).

A step is host-bound when its exposed host cycles (`partitioner/step/host.py`) are more than
`HOST_BOUND_SHARE` of its cycles. It warns only if some argument sent per call is at least
`LARGE_ARGUMENT_BYTES` on an IPU: a small program's few kilobytes are host-bound by the
transfers' latency alone (50,000 cycles each way), which no option removes. A batch can trip it
too; the message says to mark only what lives on the IPUs between calls (README, "Inference:
resident weights").
"""

from __future__ import annotations

import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from ipujax.errors import HostBoundWarning
from lowering import Graph
from partitioner import Built, sent_arguments

HOST_BOUND_SHARE = 0.5  # of the step's cycles, in host transfers
LARGE_ARGUMENT_BYTES = 64 * 1024  # per IPU, of one argument sent per call
_PACKAGES = tuple(str(Path(__file__).parents[1] / name) for name in ("ipujax", "lowering"))
_TOP_NAME = re.compile(r"[A-Za-z_]\w*")


def argument_name(graph: Graph, flat: Sequence[int]) -> tuple[str, int]:
    """An argument's name (its parameter's, the leaves' common root) and bytes per IPU."""
    given = graph.input_names
    names = [given[i] if i < len(given) else f"input {i}" for i in flat] or ["()"]
    match = _TOP_NAME.match(names[0])
    name = match.group(0) if match else names[0]
    return name, sum(graph.inputs[i].nbytes for i in flat)


def large_sent(
    graph: Graph, resident: Sequence[int], whole: Graph | None = None
) -> list[tuple[str, int]]:
    """The arguments sent from the host per call with at least `LARGE_ARGUMENT_BYTES` on an
    IPU, largest first (`whole`: the program before partitioning)."""
    arguments = [argument_name(graph, flat) for flat in sent_arguments(graph, resident, whole)]
    return sorted((a for a in arguments if a[1] >= LARGE_ARGUMENT_BYTES), key=lambda a: -a[1])


def host_share(built: Built) -> float:
    """The share of the step's cycles its exposed host transfers take."""
    host = sum(s.link_cycles for s in built.cost.supersteps if s.kind == "host")
    return host / built.cost.total_cycles if built.cost.total_cycles else 0.0


def user_stacklevel(past: tuple[str, ...] = ()) -> int:
    """The stacklevel of the first frame outside ipujax (and the packages of `past`, folders
    as `__file__` names them): the user's line that compiled."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
    skipped = _PACKAGES + past
    while frame is not None and frame.f_code.co_filename.startswith(skipped):
        frame, level = frame.f_back, level + 1
    return level


def warn_host_bound(built: Built, resident: Sequence[int]) -> None:
    """One `HostBoundWarning` when `built`'s step is host-bound and sends a large argument."""
    share = host_share(built)
    whole = built.partitioned.global_graph if built.partitioned is not None else None
    large = large_sent(built.graph, resident, whole) if share > HOST_BOUND_SHARE else []
    if not large:
        return
    sent = ", ".join(f"{name} ({nbytes:,} B)" for name, nbytes in large)
    names = tuple(dict.fromkeys(name for name, _ in large))
    warnings.warn(
        f"the step is host-bound: {share:.0%} of its {built.cost.total_cycles:,} cycles are "
        f"host transfers, and it sends {sent} from the host on every call. If they stay on the "
        "IPUs between calls (weights, a KV cache), mark them resident: "
        f"ipujax.jit(..., resident_argnames={names!r}) (or resident_argnums=...), loaded once "
        "and not charged per call.",
        HostBoundWarning,
        stacklevel=user_stacklevel(),
    )

"""On-chip exchange and sync: the cycles between two compute sets of a BSP superstep.

An exchange lasts as long as its busiest tile takes to receive its bytes at the exchange rate,
plus a fixed overhead; a sync is a fixed cost on one IPU and grows with the hops between IPUs
when a group spans several (docs/target.md, "Exchange and sync").
"""

from __future__ import annotations

import math

from partitioner.target import Target


def exchange_cycles(target: Target, busiest_tile_bytes: int) -> int:
    """The busiest tile's bytes at the exchange rate, plus the fixed overhead; nothing moved,
    nothing charged."""
    if busiest_tile_bytes <= 0:
        return 0
    transfer = math.ceil(busiest_tile_bytes / target.exchange_bytes_per_cycle)
    return transfer + target.exchange_overhead_cycles


def global_sync_cycles(target: Target, ipus: int) -> int:
    """Sync across `ipus` IPUs: there and back over 1 + ipus // 4 hops, in tile cycles."""
    return math.ceil(2 * target.global_sync_hop_seconds * (1 + ipus // 4) * target.clock_hz)

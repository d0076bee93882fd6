"""A host callback's round trip: the IPU stops, sends the callback's operands to the host, the
host runs Python and acknowledges (or sends results back), the IPU goes on (A: docs/target.md,
"Linear algebra, FFT and callbacks").

jax runs a callback synchronously: its custom call waits for the host's answer, even when there
is none to receive (jax then receives a dummy value, so the IPU knows the callback is done). On
an IPU that is a host stream copy out and one in, each paying the host link's latency
(`host_latency_cycles`) and the bytes at `host_bytes_per_second`, as the step's own host
transfers are charged (`partitioner.step.host`). The time Python takes on the host is not
charged: it is the user's code, not the machine's.
"""

from __future__ import annotations

import math

from partitioner.target import Target


def host_round_trip_cycles(target: Target, sent: int, received: int) -> int:
    """Two host transfers, out and back, each with its latency, and the bytes both ways."""
    moved = sent + received
    return 2 * target.host_latency_cycles + math.ceil(
        moved * target.clock_hz / target.host_bytes_per_second
    )

"""What one call of a compiled science program costs, read from its cost report: the host's
transfer in, the IPUs' supersteps, the transfer out, their sum (the call's latency) and calls
per second; with how many calls' work (frames, steps) it holds, the cost of one of them.

Every figure comes from the report (the Target's cost model), not a stopwatch. The device's
part is the same on every call: a BSP program's supersteps, their exchanges and their cycles
are fixed when it is compiled, whatever the values, so the IPU adds no jitter (what the host
link and the host's own scheduling add is not modelled).
"""

from __future__ import annotations

from dataclasses import dataclass

import ipujax

HOST_IN, HOST_OUT = "host: inputs", "host: outputs"  # the report's host supersteps


@dataclass(frozen=True)
class CallCost:
    """Seconds of one call: from the host, on the IPUs, back to the host."""

    host_in: float
    device: float
    host_out: float
    device_cycles: int
    clock_hz: float

    @classmethod
    def of(cls, report: ipujax.CostReport) -> CallCost:
        def cycles(name: str) -> int:
            return sum(s.cycles for s in report.supersteps if s.kind == "host" and s.name == name)

        host_in, host_out = cycles(HOST_IN), cycles(HOST_OUT)
        device = report.total_cycles - host_in - host_out
        clock = report.clock_hz
        return cls(host_in / clock, device / clock, host_out / clock, device, clock)

    @property
    def latency(self) -> float:
        return self.host_in + self.device + self.host_out

    @property
    def per_second(self) -> float:
        return 1 / self.latency

    def line(self, noun: str = "call") -> str:
        """'per call: L latency = in + on the IPUs + out; R calls/s'."""
        parts = f"{duration(self.host_in)} from the host + {duration(self.device)} on the IPUs"
        return (
            f"per {noun}: {duration(self.latency)} latency = {parts} + "
            f"{duration(self.host_out)} back; {self.per_second:,.0f} {noun}s/s"
        )

    def jitter_line(self) -> str:
        return (
            f"jitter on the IPUs: 0 cycles (every {self.device_cycles:,}-cycle call runs the "
            "same BSP supersteps, fixed when compiled)"
        )


def caveats(report: ipujax.CostReport) -> list[str]:
    """The report's caveats, a line each: what its figures assume (unvalidated collectives,
    a loop's trips)."""
    return [f"caveat: {line}" for line in report.caveats]


def duration(seconds: float) -> str:
    """Seconds as microseconds (milliseconds from 1 ms on), three significant figures."""
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} us"


def rate(nbytes: float, seconds: float) -> str:
    """Bytes per second, in TB/s or GB/s."""
    per_second = nbytes / seconds
    return f"{per_second / 1e12:.2f} TB/s" if per_second >= 1e12 else f"{per_second / 1e9:.1f} GB/s"

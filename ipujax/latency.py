"""Latency and rate of one call: what a caller of the compiled step waits for, split into the
host transfer in, the device's work and the host transfer out, and how many calls a second the
step sustains, with device iterations (docs/target.md, "Latency per call and device
iterations").

The report's step is one call: its inputs come over the host link in one transfer (a latency,
`Target.host_latency_cycles`, then its bytes at the host rate), the device runs, its results go
back in another. Poplar's device iterations (PopTorch's `deviceIterations`, PopART's
`batchesPerStep`, TensorFlow's `steps_per_execution`) run the program N times per host round:
the inputs of N calls go in one transfer and their results come back in one, so the transfers'
fixed latency is paid once per N calls, their bytes N times and the device's work N times.
Every call of a round waits for the whole round (its inputs arrive with the first transfer and
its result leaves with the last), so N raises the rate and the latency together.

`call_latency` reads this from a report's own supersteps (`split_latency` from any): the host
supersteps' exposed cycles (what compute did not hide of them) and the rest of the step;
nothing is measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from partitioner import ConfigError, Superstep

if TYPE_CHECKING:
    from ipujax.report import CostReport

HOST_INPUTS = "host: inputs"  # the names `partitioner.step.host` gives its two supersteps
HOST_OUTPUTS = "host: outputs"


@dataclass(frozen=True, slots=True)
class CallLatency:
    """One call's seconds, amortised over a round of `iterations` calls: the host transfer
    in, the device's work and the transfer out; and the round's own seconds."""

    iterations: int
    host_in_seconds: float  # per call: the transfer's latency / iterations, plus its bytes
    device_seconds: float
    host_out_seconds: float
    round_seconds: float  # one host round: `iterations` calls' transfers and device runs

    @property
    def seconds_per_call(self) -> float:
        return self.host_in_seconds + self.device_seconds + self.host_out_seconds

    @property
    def calls_per_second(self) -> float:
        return self.iterations / self.round_seconds if self.round_seconds else 0.0

    @property
    def latency_seconds(self) -> float:
        """From a call's inputs leaving the host to its results reaching it: the whole round,
        which every call of the round waits for."""
        return self.round_seconds

    def to_dict(self) -> dict[str, Any]:
        """The figures as the report's JSON gives them."""
        return {
            "iterations": self.iterations,
            "host_in_seconds": self.host_in_seconds,
            "device_seconds": self.device_seconds,
            "host_out_seconds": self.host_out_seconds,
            "seconds_per_call": self.seconds_per_call,
            "latency_seconds": self.latency_seconds,
            "calls_per_second": self.calls_per_second,
        }

    def summary(self) -> str:
        """The report's line: the split per call, the latency and the rate."""
        rounds = "" if self.iterations == 1 else f" ({self.iterations} device iterations)"
        return (
            f"host in {self.host_in_seconds * 1e3:.4f} ms + device "
            f"{self.device_seconds * 1e3:.4f} ms + host out {self.host_out_seconds * 1e3:.4f} "
            f"ms a call{rounds}; latency {self.latency_seconds * 1e3:.4f} ms, "
            f"{self.calls_per_second:,.1f} calls/s"
        )


def checked_iterations(value: Any) -> int:
    """`device_iterations=`: a positive int."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"device_iterations={value!r}: give how many calls' inputs one host transfer "
            "carries, a positive int (1: every call transfers on its own), e.g. "
            "device_iterations=16"
        )
    return value


def _round_cycles(exposed: int, latency: int, iterations: int) -> int:
    """A transfer carrying `iterations` calls' bytes: its fixed latency once (no more than
    what was charged, when compute hid part of one call's transfer), the rest once per call."""
    fixed = min(latency, exposed)
    return fixed + iterations * (exposed - fixed)


def call_latency(report: CostReport) -> CallLatency:
    """The latency split of one call of `report`'s step, with its device iterations."""
    return split_latency(
        report.supersteps,
        report.total_cycles,
        report.clock_hz,
        report.host_latency_cycles,
        report.device_iterations,
    )


def split_latency(
    supersteps: Sequence[Superstep],
    total_cycles: int,
    clock_hz: float,
    host_latency_cycles: int,
    iterations: int = 1,
) -> CallLatency:
    """The latency split of one call of a step whose `supersteps` take `total_cycles`, with
    `iterations` calls per host round, each transfer paying `host_latency_cycles` once."""
    host_in = sum(s.link_cycles for s in supersteps if s.name == HOST_INPUTS)
    host_out = sum(s.link_cycles for s in supersteps if s.name == HOST_OUTPUTS)
    device = total_cycles - host_in - host_out
    round_in = _round_cycles(host_in, host_latency_cycles, iterations)
    round_out = _round_cycles(host_out, host_latency_cycles, iterations)
    round_cycles = round_in + iterations * device + round_out
    per_call = iterations * clock_hz
    return CallLatency(
        iterations=iterations,
        host_in_seconds=round_in / per_call,
        device_seconds=device / clock_hz,
        host_out_seconds=round_out / per_call,
        round_seconds=round_cycles / clock_hz,
    )

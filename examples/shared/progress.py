"""A training loop's progress: the line that says what compiling took and what a step costs,
a tqdm bar with the loss and both throughputs, the simulator's wall clock per step, the
`step N loss L` lines, each step's loss checked against jax.jit's, and the closing summary."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

import ipujax

from .files import write_report

CHECK_RTOL, CHECK_ATOL = 1e-5, 1e-6  # a step's loss against jax.jit's, elementwise


def loss_mismatch(loss: float, want: float) -> str | None:
    """Why ipujax's loss is not jax.jit's within rounding; None when it is."""
    if np.isclose(loss, want, rtol=CHECK_RTOL, atol=CHECK_ATOL):
        return None
    return f"ipujax loss {loss!r}, jax.jit loss {want!r} (rtol {CHECK_RTOL}, atol {CHECK_ATOL})"


def announce_compiled(
    compiled: ipujax.Compiled,
    mesh: ipujax.Mesh,
    started: float,
    per_step: int,
    noun: str,
    report_path: str | None,
) -> float:
    """Prints what compiling took since `started` and what a step of `per_step` `noun`s costs,
    writes the cost report to `report_path` (--report) when given; returns the simulated IPUs'
    `noun`s per second."""
    report = compiled.cost_report()
    rate = per_step / report.seconds
    print(
        f"compiled in {time.perf_counter() - started:.1f} s: {report.total_cycles:,} cycles per "
        f"step = {report.seconds * 1e3:.3f} ms on {mesh.ipus} {mesh.target.name} IPU(s), "
        f"{rate:,.0f} {noun}/s simulated, fits: {report.fits}"
    )
    if report_path:
        write_report(report_path, report)
    return rate


class Meter:
    """Wall-clock seconds per step of the simulator, leaving out the first (which compiles the
    runtime)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def add(self, seconds: float) -> None:
        self.times.append(seconds)

    @property
    def seconds(self) -> float:
        steady = self.times[1:] or self.times
        return float(np.mean(steady)) if steady else float("nan")


@dataclass(frozen=True)
class Throughput:
    """What a step processes, and the simulated IPU system's rate of it."""

    per_step: int  # tokens or images a step
    ipu_rate: float  # of them per second on the simulated IPUs
    unit: str  # their name in the bar: "tok", "img"
    noun: str  # and in the summary: "tokens", "images"
    digits: int = 0  # decimals of the simulator's rate in the summary

    def postfix(self, loss: float, seconds: float) -> str:
        """The bar's text after a step of `seconds` on the simulator."""
        sim = self.per_step / seconds
        return (
            f"loss {loss:.4f} sim {sim:,.0f} {self.unit}/s ipu {self.ipu_rate:,.0f} {self.unit}/s"
        )

    def rates(self, seconds: float) -> str:
        """The summary's rates at `seconds` a step on the simulator."""
        return (
            f"simulator {self.per_step / seconds:,.{self.digits}f} {self.noun}/s "
            f"({seconds * 1e3:.1f} ms per step), simulated IPUs {self.ipu_rate:,.0f} {self.noun}/s"
        )


class Progress:
    """Steps `start + 1` to `steps` of a loop: a tqdm bar (none with `bar=False`), their losses
    (appended to `losses`), the simulator's wall clock per step, the `step N loss L` lines (the
    first step's, every `log_every`th and the last's) and the largest difference from jax.jit's
    loss. With `throughput`, the bar and the summary show both throughputs."""

    def __init__(
        self,
        steps: int,
        log_every: int,
        *,
        start: int = 0,
        losses: list[float] | None = None,
        bar: bool = True,
        throughput: Throughput | None = None,
    ) -> None:
        self.steps, self.log_every, self.start = steps, log_every, start
        self.losses = [] if losses is None else losses
        self.throughput = throughput
        self.meter = Meter()
        self.worst = 0.0
        self.bar = tqdm(total=steps, initial=start, disable=not bar, unit="step")

    @classmethod
    def of_flags(
        cls,
        args: argparse.Namespace,
        throughput: Throughput | None = None,
        start: int = 0,
        losses: list[float] | None = None,
    ) -> Progress:
        """Steps to --steps, a loss line every --log-every, a bar unless --no-progress (or the
        script has no such flag)."""
        bar = not getattr(args, "no_progress", True)
        return cls(
            args.steps, args.log_every, start=start, losses=losses, bar=bar, throughput=throughput
        )

    def __enter__(self) -> Progress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(*exc)

    def timed(self, step: Callable[..., Any], *args: Any) -> Any:
        """`step(*args)`, waited for, its wall clock recorded."""
        t = time.perf_counter()
        out = jax.block_until_ready(step(*args))
        self.meter.add(time.perf_counter() - t)
        return out

    def compare(self, loss: float, want: float) -> str | None:
        """`loss_mismatch(loss, want)`, the difference counted in the largest seen."""
        self.worst = max(self.worst, abs(loss - want))
        return loss_mismatch(loss, want)

    def failed(self, step: int, problem: str) -> int:
        """Closes the bar and says why step `step` failed its check; the exit status, 1."""
        self.bar.close()
        print(f"check failed at step {step}: {problem}", file=sys.stderr)
        return 1

    def done(self, step: int, loss: float) -> None:
        self.losses.append(loss)
        if self.throughput is not None:
            postfix = self.throughput.postfix(loss, self.meter.times[-1])
            self.bar.set_postfix_str(postfix, refresh=False)
        self.bar.update()
        if step == self.start + 1 or step % self.log_every == 0 or step == self.steps:
            tqdm.write(f"step {step} loss {loss:.4f}")

    def summary(self, first: int) -> str:
        """'steps {first}->{steps}: loss a -> b' over this run's steps; with `throughput`, the
        mean of the last ten losses and the simulator's and simulated IPUs' rates."""
        new = self.losses[self.start :]
        line = f"steps {first}->{self.steps}: loss {new[0]:.4f} -> {new[-1]:.4f}"
        if self.throughput is None:
            return line
        tail = new[-10:]
        rates = self.throughput.rates(self.meter.seconds)
        return f"{line} (mean of the last {len(tail)}: {np.mean(tail):.4f}); {rates}"

    def check_passed(self) -> str:
        steps = self.steps - self.start
        return f"check passed: {steps} steps, max |loss - jax.jit loss| {self.worst:.3g}"

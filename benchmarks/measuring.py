"""How the benchmark runner measures: progress lines, timed calls, the difference between two
sides' outputs, a process's peak memory and child processes (`run.py --child KIND JSON`)."""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import spmd_compare

RUNNER = Path(__file__).resolve().with_name("run.py")  # what a child process runs
PEAK_MEMORY = (
    "Peak memory is `VmHWM` of the child's /proc/self/status, the high-water mark of its own "
    "address space, not `getrusage(RUSAGE_SELF).ru_maxrss`: on Linux a child's `ru_maxrss` "
    "starts at its parent's peak, which is carried across exec"
)


def log(message: str) -> None:
    """A progress line on stderr, stamped with the seconds since the runner started."""
    print(f"[{time.perf_counter() - _START:7.1f} s] {message}", file=sys.stderr, flush=True)


_START = time.perf_counter()


def timed(fun: Callable[[], Any], block: bool = True) -> tuple[float, Any]:
    """Seconds of one call (its array results ready, with `block`) and the results."""
    start = time.perf_counter()
    out = fun()
    if block:
        out = jax.block_until_ready(out)
    return time.perf_counter() - start, out


def max_abs_diff(a: Any, b: Any) -> float:
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    if len(leaves_a) != len(leaves_b):
        raise ValueError(f"{len(leaves_a)} outputs against {len(leaves_b)}")
    return max(
        (
            float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)), initial=0))
            for x, y in zip(leaves_a, leaves_b, strict=True)
        ),
        default=0.0,
    )


def peak_memory_bytes() -> int:
    """This process's peak resident memory so far: `VmHWM` of /proc/self/status, the high-water
    mark of this process's own address space. (`getrusage(RUSAGE_SELF).ru_maxrss`, the same figure
    elsewhere, is no good in a child process on Linux: it keeps the parent's peak across exec.)"""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def run_child(kind: str, payload: dict[str, Any], devices: int | None = None) -> dict[str, Any]:
    """Runs `kind` in a fresh Python process (`run.py` with `--child`); with `devices`, jax
    there has that many forced host devices. Returns the JSON the child prints last."""
    argv = [str(RUNNER), "--child", kind, json.dumps(payload)]
    return spmd_compare.run_json_child(argv, devices, kind, timeout=1800)


def warm_up_jax() -> None:
    """jax's one-time start-up costs (backend, first compile), paid before anything is timed."""
    jax.block_until_ready(jax.jit(lambda x: x * 2 + 1)(np.float32(1)))

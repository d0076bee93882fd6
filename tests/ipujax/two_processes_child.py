"""Two processes joined by `jax.distributed`, for test_two_processes.py: the multi-host setup run
on one machine. Each process has its own CPU devices, the coordinator listens on 127.0.0.1, and
XLA's collectives between the processes go over gloo (jax's default on CPU, nothing to set).
Every process compiles the same dp=2 x tp=2 training step spread over the devices of both, runs
it, gathers the results and compares them with the same step run by this process alone; each
prints one JSON line of what it found.

Not a test module itself (pytest collects only test_*.py). Run without `--process-id`, it
launches both processes and prints their reports, e.g. for the figures in docs/distributed.md:

    PYTHONPATH=. .venv/bin/python tests/ipujax/two_processes_child.py \\
        [--devices-per-process 2] [--workload tiny_gpt]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import PartitionSpec as P
from two_devices_child import TARGET, example, leaves, max_difference, sgd_step

import ipujax
from lowering.evaluator import flatten_args

ROOT = Path(__file__).resolve().parents[2]
PROCESSES = 2
# How long a process waits for the other to join, answer heartbeats or reach shutdown before
# it gives up (jax's defaults are minutes; a test wants a failure well before its deadline).
PEER_SECONDS = 30
WARM_STEPS = 20


# ---- the launcher: both processes, with a deadline ---------------------------------------------


@dataclasses.dataclass(frozen=True)
class Finished:
    """One child's exit: its return code (None if it was killed) and what it printed."""

    process_id: int
    returncode: int | None
    stdout: str
    stderr: str

    def report(self) -> dict[str, Any]:
        """The JSON line the child printed last (gloo prints lines of its own too)."""
        lines = [line for line in self.stdout.splitlines() if line.startswith("{")]
        if not lines:
            raise AssertionError(f"no report printed\n{self.describe()}")
        return json.loads(lines[-1])

    def describe(self) -> str:
        """Everything the child printed, for a failure message."""
        status = "killed" if self.returncode is None else f"exit code {self.returncode}"
        return (
            f"---- process {self.process_id}: {status}\n"
            f"-- stdout:\n{self.stdout}\n-- stderr:\n{self.stderr}"
        )


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for the coordinator: a fixed one would collide with
    another run, or anything else listening."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(
    devices_per_process: int = 1, workload: str = "mlp", timeout: float = 120
) -> list[Finished]:
    """Runs both processes to the end, or kills them at `timeout` seconds. When one fails the
    other is killed a few seconds later: it would wait in a collective for the dead one."""
    command = [sys.executable, __file__, "--port", str(free_port()), "--workload", workload]
    command += ["--devices-per-process", str(devices_per_process)]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    with contextlib.ExitStack() as files:
        # Files, not pipes: a child blocked on a full pipe would look like a hung collective.
        out = [files.enter_context(tempfile.TemporaryFile("w+")) for _ in range(PROCESSES)]
        err = [files.enter_context(tempfile.TemporaryFile("w+")) for _ in range(PROCESSES)]
        children = [
            subprocess.Popen(
                [*command, "--process-id", str(i)],
                cwd=ROOT,
                env=env,
                stdout=out[i],
                stderr=err[i],
                text=True,
            )
            for i in range(PROCESSES)
        ]
        try:
            _wait(children, time.monotonic() + timeout)
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
                child.wait()
        return [_finished(i, child, out[i], err[i]) for i, child in enumerate(children)]


def _wait(children: list[subprocess.Popen], deadline: float, grace: float = 5) -> None:
    while any(c.poll() is None for c in children) and time.monotonic() < deadline:
        if any(c.poll() not in (None, 0) for c in children):
            deadline = min(deadline, time.monotonic() + grace)
        time.sleep(0.05)


def _finished(process_id: int, child: subprocess.Popen, out: IO[str], err: IO[str]) -> Finished:
    out.seek(0)
    err.seek(0)
    # A negative return code is the signal that killed the child: ours, at the deadline.
    code = child.returncode if child.returncode >= 0 else None
    return Finished(process_id, code, out.read(), err.read())


# ---- one process --------------------------------------------------------------------------------


def connect(process_id: int, port: int, devices_per_process: int) -> None:
    """Joins the two processes; must run before anything touches a jax backend."""
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", devices_per_process)
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=PROCESSES,
        process_id=process_id,
        initialization_timeout=PEER_SECONDS,
        heartbeat_timeout_seconds=PEER_SECONDS,
        shutdown_timeout_seconds=PEER_SECONDS,
    )


def mlp(mesh: ipujax.Mesh) -> tuple[Callable, tuple, dict[str, Any]]:
    """An MLP's SGD step: weights split over tp, the batch over dp (as in two_devices_child)."""
    params = {"w1": P(None, "tp"), "b1": P("tp"), "w2": P("tp", None)}
    return sgd_step, example(), {"mesh": mesh, "in_shardings": (params, P("dp"), P("dp"))}


def tiny_gpt(mesh: ipujax.Mesh) -> tuple[Callable, tuple, dict[str, Any]]:
    """The tiny GPT's AdamW step of examples/gpt/workloads.py, the one docs/distributed.md
    times on forced devices."""
    path = ROOT / "examples" / "gpt" / "workloads.py"
    spec = importlib.util.spec_from_file_location("gpt_workloads", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.tiny(mesh)


WORKLOADS = {"mlp": mlp, "tiny_gpt": tiny_gpt}


def gathered(tree: Any) -> list[np.ndarray]:
    """Every leaf whole on this host. A process holds only its own devices' shards of a global
    array; `process_allgather` brings the others' (a collective: every process calls it)."""
    return [
        np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        for leaf in jax.tree.leaves(tree)
    ]


def compile_and_run(fun: Callable, args: tuple, **jit_kwargs: Any) -> tuple[Any, Any, float]:
    """`fun` compiled by ipujax, its outputs for `args`, and the seconds both took."""
    start = time.perf_counter()
    compiled = ipujax.jit(fun, **jit_kwargs).lower(*args).compile()
    out = jax.block_until_ready(compiled(*args))
    return compiled, out, time.perf_counter() - start


def warm_step_seconds(compiled: ipujax.Compiled, args: tuple, out: tuple) -> float:
    """The median seconds of a step fed the previous step's state (its outputs but the last,
    the loss) and the same batch (the arguments after the state)."""
    times = []
    for _ in range(WARM_STEPS):
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(*out[:-1], *args[len(out) - 1 :]))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def collectives(compiled: ipujax.Compiled, args: tuple) -> dict[str, int]:
    """The collectives of the XLA program the devices run (across devices, so across the
    processes for an axis spread over both)."""
    with jax.enable_x64(True):
        flat = flatten_args(compiled.graph, args, {})
    text = compiled.run.lower(*flat).compile().as_text()
    kinds = r"all-reduce|all-gather|collective-permute|all-to-all|reduce-scatter"
    return dict(collections.Counter(re.findall(rf" ({kinds})(?:-start)?\(", text)))


def devices_of(devices: Any) -> list[list[int]]:
    """[id, process] of each device."""
    return [[d.id, d.process_index] for d in devices]


def measure(workload: str) -> dict[str, Any]:
    """The workload's step spread over every process's devices, against this process alone
    (its first device) and against jax.jit."""
    mesh = ipujax.make_mesh((2, 2), ("dp", "tp"), target=TARGET)
    fun, args, jit_kwargs = WORKLOADS[workload](mesh)
    spread, ours, spread_s = compile_and_run(fun, args, **jit_kwargs)
    alone, theirs, alone_s = compile_and_run(
        fun, args, devices=jax.local_devices()[:1], **jit_kwargs
    )
    ours_whole = gathered(ours)
    homes = {d for leaf in jax.tree.leaves(ours) for d in leaf.sharding.device_set}
    return {
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "devices": devices_of(jax.devices()),
        "compiled_devices": devices_of(spread.devices),
        "alone_devices": devices_of(alone.devices),
        "output_processes": sorted({d.process_index for d in homes}),
        # A replicated output (the loss) is readable on every process without gathering.
        "loss": float(ours[-1]),
        "exact_vs_one_process": all(
            np.array_equal(a, b) for a, b in zip(ours_whole, leaves(theirs), strict=True)
        ),
        "max_diff_vs_one_process": max_difference(ours_whole, theirs),
        "largest_value": max(float(np.max(np.abs(leaf))) for leaf in ours_whole),
        # The same on both processes: each gathered every shard.
        "digest": hashlib.sha256(b"".join(leaf.tobytes() for leaf in ours_whole)).hexdigest(),
        "max_diff_vs_jax_jit": max_difference(ours_whole, jax.jit(fun)(*args)),
        "collectives": collectives(spread, args),
        "compile_and_first_call_s": {"two_processes": spread_s, "one_process": alone_s},
        "warm_step_ms": {
            "two_processes": 1e3 * warm_step_seconds(spread, args, ours),
            "one_process": 1e3 * warm_step_seconds(alone, args, theirs),
        },
        # Outputs fed back were where the program takes its inputs: still one XLA compile.
        "xla_compiles": spread.run.jitted._cache_size(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--process-id", type=int, help="be this process (else launch both)")
    parser.add_argument("--port", type=int, help="the coordinator's port on 127.0.0.1")
    parser.add_argument("--devices-per-process", type=int, default=1)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="mlp")
    options = parser.parse_args()
    if options.process_id is None:
        for finished in launch(options.devices_per_process, options.workload, timeout=600):
            ok = finished.returncode == 0
            print(json.dumps(finished.report()) if ok else finished.describe())
        return
    connect(options.process_id, options.port, options.devices_per_process)
    print(json.dumps(measure(options.workload)), flush=True)


if __name__ == "__main__":
    main()

"""The memory section: the GPT step and a matmul chain compiled and run on Bow IPUs of few and
of many tiles, a child process each (`child_memory`): the host's peak memory, which should not
grow with the tile count."""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np
from measuring import PEAK_MEMORY, log, peak_memory_bytes, run_child
from programs import bow, gpt_step, matmul_chain
from results import MiB, Section, goal, markdown_table, mib
from setups import Setup, setup_payload

import ipujax

# The goal; it is printed as met or NOT met beside its figure.
MEMORY_RATIO_GOAL = 1.25  # memory above the baseline, most tiles / fewest tiles


def child_memory(payload: dict[str, Any]) -> dict[str, Any]:
    """One program compiled and run on one IPU of `tiles` tiles: peak host memory. The memory
    check is off: on a 16-tile IPU nothing this size fits, and the host's memory is the point."""
    baseline = peak_memory_bytes()
    if payload["program"] == "gpt":
        step = gpt_step(payload["config"], payload["batch"])
        fun, args = step.fresh(), step.args
    else:
        fun, args = matmul_chain(*payload["matmul"])
    mesh = ipujax.make_mesh((1,), ("ipu",), target=bow(payload["tiles"]))
    start = time.perf_counter()
    compiled = ipujax.jit(fun, mesh=mesh).lower(*args).compile(check_memory_fits=False)
    out = jax.block_until_ready(compiled(*args))
    seconds = time.perf_counter() - start
    tensor_bytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves((args, out)))
    return {
        "baseline": baseline,
        "peak": peak_memory_bytes(),
        "tensor_bytes": tensor_bytes,
        "seconds": seconds,
    }


def memory_section(setup: Setup) -> Section:
    header = (
        "program",
        "tiles",
        "tensor MiB",
        "baseline MiB",
        "peak MiB",
        "above baseline MiB",
        "vs fewest tiles",
        f"goal <= {MEMORY_RATIO_GOAL}",
        "compile + run s",
    )
    size, depth = setup.matmul
    labels = {"gpt": "GPT AdamW step", "matmul": f"{depth} x tanh(x @ w), {size}x{size} f32"}
    rows, goals = [], []
    for program in setup.memory_programs:
        label = labels[program]
        above = {}
        for tiles in setup.memory_tiles:
            log(f"memory: {label} on a {tiles}-tile Bow, in a child process")
            payload = {**setup_payload(setup), "program": program, "tiles": tiles}
            data = run_child("memory", payload)
            above[tiles] = data["peak"] - data["baseline"]
            ratio = above[tiles] / max(1, above[setup.memory_tiles[0]])
            first = tiles == setup.memory_tiles[0]
            rows.append(
                (
                    label,
                    f"{tiles:,}",
                    f"{data['tensor_bytes'] / MiB:,.1f}",
                    mib(data["baseline"]),
                    mib(data["peak"]),
                    mib(above[tiles]),
                    "" if first else f"{ratio:.2f}",
                    "" if first else goal(ratio <= MEMORY_RATIO_GOAL),
                    f"{data['seconds']:.1f}",
                )
            )
        # The goal is that memory does not grow with the tile count; fewer tiles may cost
        # more (a 16-tile matmul plan moves bigger blocks through XLA's scratch memory).
        growth = max(above.values()) / max(1, above[setup.memory_tiles[0]])
        goals.append((f"memory vs tiles, {label}: {growth:.2f}x", growth <= MEMORY_RATIO_GOAL))
    meaning = (
        "Each program compiled (memory check off: nothing this size fits 16 tiles) and run once "
        "on one Bow IPU of that many tiles, in a child process of its own. tensor MiB: the "
        "program's arguments and results; baseline MiB: the child's peak resident memory after "
        "importing jax, ipujax and this runner; peak MiB: after the run; above baseline: their "
        "difference, what compiling and running this program cost (XLA's compile of the "
        "runtime included); vs fewest tiles: that figure over the same at the fewest tiles, and "
        f"the goal is that it is at most {MEMORY_RATIO_GOAL}: memory does not grow with the tile "
        f"count. {PEAK_MEMORY}. The runtime keeps tensors in logical order, whatever their "
        "layout on tiles, so memory should follow the tensors' bytes, not the tile count."
    )
    title = "Simulator memory against tile count"
    return Section("memory", title, markdown_table(header, rows), meaning, tuple(goals))

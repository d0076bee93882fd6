"""The benchmark runner behind `make bench`: ipujax against jax.jit, on one machine, in one run.

It prints one table per section (progress goes to stderr) and writes them all, with the
machine's details and what each number means, to `benchmarks/RESULTS.md` (atomically). The
sections, any subset of which `--only` picks:

* run: the GPT AdamW training step of `examples/gpt/model.py` through `ipujax.jit` on 1, 4
  (dp=2 x tp=2) and 64 (dp=8 x tp=8) Bow IPUs against `jax.jit` on the CPU; the median of
  several warm calls of each, the two sides' calls interleaved, their ratio and the largest
  difference between their outputs.
* compile: ipujax's lower + compile + first call (the runtime's XLA compile happens then) minus
  one warm call, against `jax.jit(step).lower(*args).compile()`.
* ecosystem: the first call of the flax, equinox and haiku models of tests/ecosystem through
  `ipujax.jit` against `jax.jit`'s, on the run section's meshes.
* spmd: XLA's SPMD partitioner on the same step and PartitionSpecs, over 4 and 64 forced host
  devices in a child process each: its warm call and its collective bytes per device, beside
  ipujax's per IPU (counted as `spmd_compare.py` counts them).
* gpt3: GPT-3 175B on a Pod256 (dp 4 x tp1 8 x tp2 8, `phases="auto"`), cost only, in a fresh
  child process: lower and compile seconds and the process's peak host memory.
* memory: the GPT step and a matmul chain compiled and run on a 16-tile and a 1,472-tile Bow, a
  child process each: peak host memory, which should not grow with the tile count.
* cnn: the small ResNet's training step of `examples/resnet`, data parallel on 16 Bow IPUs,
  against `jax.jit`: warm calls interleaved, their ratio.
* loops: the gradient of a 32-layer `lax.scan` (and of a transformer's blocks in one scan) on
  4 data-parallel Bow IPUs, a fresh function's first call against `jax.jit`'s, the scanned
  transformer's again on the run section's meshes (tensor-parallel as Megatron), and GPT-3 175B
  at PopXL's batch (32 micro-batches summed by a scan) on a Pod256, `phases="auto"`, cost only,
  in a fresh child process: lower and compile seconds, peak host memory, phases and fits.
* plan: `ipujax plan` as a user runs it, GPT-3 175B on a Pod256 and BERT-Large on a Pod16, a
  fresh process each: wall seconds start to exit, the search's compiles and its best plan.
* fidelity: every published figure of `ipujax/fidelity.py` against ipujax's cost report, their
  ratios; rewrites docs/fidelity.md too.

Child processes are this file run with `--child KIND JSON`; each prints its figures as JSON. Peak
memory is the child's `VmHWM` (see `measuring.peak_memory_bytes`). Each section's goal is printed
as met or NOT met beside its figure; an unmet goal does not fail the run, an exception does.
`--quick` runs every section on tiny inputs (the tiny GPT on 2 IPUs of 16 tiles, its step's
cost-only compile, small matmuls) for the smoke test in `tests/bench/test_run.py`; its figures
mean nothing.

This file is the command line and runs the sections in order; the rest lives beside it, one
concept per module (they import each other by their plain names, benchmarks/ being on sys.path):
`setups.py` (what to measure: `FULL`, `QUICK`), `programs.py` (the GPT step, the matmul chain,
Bow targets), `measuring.py` (timing, peak memory, child processes), `timing.py` (the run and
compile sections), `spmd.py`, `gpt3.py`, `memory.py` and `loops.py` (a section each, with its
child), `cnn.py`, `plan.py`, `fidelity.py`, and `results.py` (tables, the machine's details,
RESULTS.md).

    python benchmarks/run.py                                  # everything; writes RESULTS.md
    python benchmarks/run.py --only run,compile --repeats 3 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before jax is imported, by any module below

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from cnn import cnn_section  # noqa: E402
from ecosystem import ecosystem_section  # noqa: E402
from fidelity import fidelity_section  # noqa: E402
from gpt3 import child_cost, gpt3_section  # noqa: E402
from loops import child_popxl, loops_section  # noqa: E402
from measuring import log, warm_up_jax  # noqa: E402
from memory import child_memory, memory_section  # noqa: E402
from plan import plan_section  # noqa: E402
from programs import gpt_step  # noqa: E402
from results import (  # noqa: E402
    RESULTS,
    Section,
    busy_warning,
    goal,
    load_average,
    machine,
    render,
    write_atomically,
)
from setups import FULL, QUICK, Setup  # noqa: E402
from spmd import child_xla, spmd_section  # noqa: E402
from spmd_compare import REPO  # noqa: E402
from timing import compile_section, measure_mesh, run_section  # noqa: E402

SECTIONS = (
    "run",
    "compile",
    "ecosystem",
    "spmd",
    "gpt3",
    "memory",
    "cnn",
    "loops",
    "plan",
    "fidelity",
)
CHILDREN: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "xla": child_xla,
    "cost": child_cost,
    "memory": child_memory,
    "popxl": child_popxl,
}


def measure(
    setup: Setup, only: Sequence[str], repeats: int, timings: dict[str, float]
) -> list[Section]:
    """Every section asked for, in the order of SECTIONS; each table is printed when it is done."""
    warm_up_jax()
    meshes = setup.meshes if {"run", "compile"} & set(only) else ()
    if not meshes and "spmd" in only:
        meshes = setup.many  # for ipujax's side of the table
    start = time.perf_counter()
    step = gpt_step(setup.config, setup.batch) if meshes else None
    runs = [measure_mesh(setup, step, m, repeats) for m in meshes if step is not None]
    if runs:
        timings["run + compile"] = time.perf_counter() - start
    builders: dict[str, Callable[[], Section]] = {
        "run": lambda: run_section(runs, repeats),
        "compile": lambda: compile_section(runs, setup.compiles),
        "ecosystem": lambda: ecosystem_section(setup),
        "spmd": lambda: spmd_section(setup, [r for r in runs if r.mesh.ipus > 1], repeats),
        "gpt3": lambda: gpt3_section(setup),
        "memory": lambda: memory_section(setup),
        "cnn": lambda: cnn_section(setup, repeats),
        "loops": lambda: loops_section(setup),
        "plan": lambda: plan_section(setup),
        "fidelity": lambda: fidelity_section(setup),
    }
    sections = []
    for name in (n for n in SECTIONS if n in only):
        start = time.perf_counter()
        sections.append(builders[name]())
        if name not in ("run", "compile"):
            timings[name] = time.perf_counter() - start
        print(f"\n## {sections[-1].title}\n\n{sections[-1].table}", flush=True)
        for note in sections[-1].notes:
            print(f"- {note}", flush=True)
    return sections


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections to run (default all: {','.join(SECTIONS)})",
    )
    parser.add_argument("--repeats", type=int, default=7, help="warm calls per side (default 7)")
    parser.add_argument("--no-write", action="store_true", help="do not write RESULTS.md")
    parser.add_argument(
        "--quick", action="store_true", help="tiny inputs, 16-tile IPUs: a smoke test"
    )
    parser.add_argument("--child", nargs=2, metavar=("KIND", "JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(args.only) - set(SECTIONS))
    if unknown or not args.only:
        parser.error(f"unknown sections {unknown}; choose from {','.join(SECTIONS)}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        kind, payload = args.child
        print(json.dumps(CHILDREN[kind](json.loads(payload))))
        return 0
    given = sys.argv[1:] if argv is None else list(argv)
    command = " ".join(["python", "benchmarks/run.py", *given])
    about = machine()
    warnings = busy_warning(os.getloadavg()[0])
    for line in warnings:
        print(line)
    start = time.perf_counter()
    timings: dict[str, float] = {}
    sections = measure(QUICK if args.quick else FULL, args.only, args.repeats, timings)
    timings["total"] = time.perf_counter() - start
    about.insert(-1, ("load average (1, 5, 15 min) at the end", load_average()))
    print("\n## Goals\n")
    for line in warnings:
        print(line)
    for what, met in (g for s in sections for g in s.goals):
        print(f"- {goal(met)}: {what}")
    print(f"\ntotal {timings['total']:.0f} s")
    if not args.no_write:
        write_atomically(RESULTS, render(sections, about, command, timings, warnings))
        log(f"wrote {RESULTS.relative_to(REPO)}")
        for path, text in (f for s in sections for f in s.files):
            write_atomically(path, text)
            log(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

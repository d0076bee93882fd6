"""The plan section: `ipujax plan` run as a user runs it, GPT-3 175B on a Bow Pod256 and
BERT-Large on a Bow Pod16 (or, with `--quick`, the tiny GPT on 2 IPUs), each a fresh process
timed from start to exit: its wall seconds, the search's compiles and the best plan it found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from measuring import log
from results import Section, goal, markdown_table
from setups import Setup
from spmd_compare import REPO

from ipujax.planning.workers import MAX_JOBS, default_jobs

PLAN_SECONDS_GOAL = 60.0  # `ipujax plan`, start to exit (issue 39)


def run_plan(spec: str, system: str) -> dict[str, Any]:
    """`python -m ipujax plan SPEC --system SYSTEM` in a fresh process: its wall seconds and
    its ranked plans (the JSON it writes)."""
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "plans.json"
        argv = [sys.executable, "-m", "ipujax", "plan", spec, "--system", system]
        argv += ["--json", str(out), "--quiet"]
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[1:])} failed:\n{done.stderr[-2000:]}")
        return {"seconds": seconds, **json.loads(out.read_text())}


def _best(plans: dict[str, Any]) -> tuple[str, str]:
    """The best plan's mesh and options, and its step and throughput, as the table shows them."""
    if not plans["plans"]:
        return "none", "-"
    best = plans["plans"][0]
    mesh = " x ".join(f"{n} {s}" for n, s in best["mesh"].items())
    pipeline = best["pipeline"]
    if best["phases"]:
        mesh += ", phases"
    if pipeline:
        mesh += f", {pipeline['microbatches']} micro-batches"
        mesh += ", recompute" if pipeline["recompute"] else ", stashing"
    rate = f"{best['predicted_seconds']:.4g} s, {best['samples_per_second']:,.1f}/s"
    return mesh + ("" if best["fits"] else " (does NOT fit)"), rate


def plan_section(setup: Setup) -> Section:
    rows, goals = [], []
    for spec, system in setup.plans:
        log(f"plan: ipujax plan {spec} --system {system}")
        data = run_plan(spec, system)
        mesh, rate = _best(data)
        met = data["seconds"] <= PLAN_SECONDS_GOAL
        name = spec.rsplit(":", 1)[-1]
        rows.append(
            (
                name,
                system,
                f"{data['seconds']:.1f}",
                goal(met),
                str(data["compiles"]),
                f"{len(data['plans'])} / {len(data['skipped'])}",
                mesh,
                rate,
            )
        )
        goals.append((f"ipujax plan {name} --system {system}: {data['seconds']:.1f} s", met))
    header = (
        "workload",
        "system",
        "wall s",
        f"goal <= {PLAN_SECONDS_GOAL:g} s",
        "compiles",
        "costed / skipped",
        "best plan",
        "its step, samples/s",
    )
    meaning = (
        "`python -m ipujax plan SPEC --system SYSTEM --json ... --quiet` in a fresh process "
        f"(docs/plan.md), with its default worker processes ({default_jobs()} here: the "
        "usable cores, at most "
        f"{MAX_JOBS}; the same plans with `--jobs 1`). "
        "wall s: from the process's start to its exit, imports included; "
        "compiles: the search's cost-only compiles (shallow copies of a layered model "
        "included); costed / skipped: plans costed and candidates ruled out without a compile "
        "(not expressible, memory or cost bound, dominated); best plan: the first of the "
        "ranking (fitting first, then samples per second), its predicted step and throughput."
    )
    title = "The plan search (`ipujax plan`)"
    return Section("plan", title, markdown_table(header, rows), meaning, tuple(goals))

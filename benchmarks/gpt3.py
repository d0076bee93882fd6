"""The gpt3 section: GPT-3 175B on a Pod256 (or, with `--quick`, the GPT step), compiled for
cost only with `phases="auto"` in a fresh child process (`child_cost`): lower and compile
seconds, the process's peak host memory and the simulated step."""

from __future__ import annotations

from typing import Any

from measuring import PEAK_MEMORY, log, peak_memory_bytes, run_child, timed
from programs import workloads
from results import Section, goal, markdown_table, mib
from setups import MeshSpec, Setup, setup_payload

import ipujax

COST_NAMES = {"gpt3_175b": "GPT-3 175B", "step": "The GPT step"}

# Goals; each is printed as met or NOT met beside its figure.
GPT3_SECONDS_GOAL = 10.0  # lower + compile (issue 39)
GPT3_MEMORY_GOAL = 2 << 30  # peak host memory (bytes)


def cost_workload(payload: dict[str, Any], mesh: ipujax.Mesh) -> tuple[Any, Any, Any]:
    """(fun, args, jit kwargs) of a factory of workloads.py, or for "step" the payload's GPT
    step, shapes only, with `batch` sequences per dp replica."""
    if payload["workload"] != "step":
        return getattr(workloads(), payload["workload"])(mesh)
    config = workloads().model.Config(**payload["config"])
    return workloads().training_step(config, payload["batch"], mesh)


def child_cost(payload: dict[str, Any]) -> dict[str, Any]:
    """A workload of examples/gpt/workloads.py compiled for cost only, phases="auto"."""
    spec = MeshSpec(tuple(payload["shape"]), tuple(payload["names"]))
    mesh = ipujax.make_mesh(spec.shape, spec.names)
    return costed(lambda: cost_workload(payload, mesh))


def costed(make: Any) -> dict[str, Any]:
    """The workload `make()` returns compiled for cost only, phases="auto": the seconds of
    each stage, the peak host memory and the report's step seconds, fit and phases."""
    baseline = peak_memory_bytes()
    build, (fun, args, kwargs) = timed(make, block=False)
    jitted = ipujax.jit(fun, **kwargs, phases="auto")
    lower, lowered = timed(lambda: jitted.lower(*args), block=False)
    compile_, compiled = timed(lowered.compile, block=False)
    report_seconds, report = timed(compiled.cost_report, block=False)
    return {
        "baseline": baseline,
        "build": build,
        "lower": lower,
        "compile": compile_ + report_seconds,
        "peak": peak_memory_bytes(),
        "step_seconds": report.seconds,
        "fits": report.fits,
        "phases": len(report.phases),
    }


def gpt3_section(setup: Setup) -> Section:
    spec = setup.cost_mesh
    log(f"gpt3: {setup.cost_workload} on {spec.label}, cost only, in a child process")
    payload = {
        **setup_payload(setup),
        "workload": setup.cost_workload,
        "shape": spec.shape,
        "names": spec.names,
    }
    data = run_child("cost", payload)
    total = data["lower"] + data["compile"]
    header = (
        "workload",
        "mesh",
        "lower s",
        "compile s",
        "total s",
        f"goal <= {GPT3_SECONDS_GOAL:g} s",
        "baseline MiB",
        "peak MiB",
        f"goal <= {GPT3_MEMORY_GOAL >> 30} GiB",
        "simulated step",
        "fits",
    )
    row = (
        setup.cost_workload,
        spec.label,
        f"{data['lower']:.1f}",
        f"{data['compile']:.1f}",
        f"{total:.1f}",
        goal(total <= GPT3_SECONDS_GOAL),
        mib(data["baseline"]),
        mib(data["peak"]),
        goal(data["peak"] <= GPT3_MEMORY_GOAL),
        f"{data['step_seconds']:.3f} s, {data['phases']} phases",
        "yes" if data["fits"] else "NO",
    )
    meaning = (
        f"`workloads.{setup.cost_workload}(mesh)` (shapes only: `jax.ShapeDtypeStruct`s) through "
        '`ipujax.jit(fun, **kwargs, phases="auto")` in a fresh child process. lower s: '
        "`.lower(*args)`; compile s: `.compile()` and `.cost_report()`; total: their sum (building "
        f"the shapes, {data['build']:.1f} s, is not counted). baseline MiB: the child's peak "
        "resident memory after importing jax, ipujax and this runner; peak MiB: after compiling. "
        f"{PEAK_MEMORY}. simulated step: the cost report's seconds per training step on the "
        "virtual system, and its number of phases; fits: whether every tile's peak fits."
    )
    name = COST_NAMES.get(setup.cost_workload, setup.cost_workload)
    goals = (
        (f"{name} compile: {total:.1f} s", total <= GPT3_SECONDS_GOAL),
        (f"{name} peak host memory: {mib(data['peak'])} MiB", data["peak"] <= GPT3_MEMORY_GOAL),
    )
    title = f"{name} on {spec.label}, cost only"
    return Section("gpt3", title, markdown_table(header, [row]), meaning, goals)

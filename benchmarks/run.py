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
* spmd: XLA's SPMD partitioner on the same step and PartitionSpecs, over 4 and 64 forced host
  devices in a child process each: its warm call and its collective bytes per device, beside
  ipujax's per IPU (counted as `spmd_compare.py` counts them).
* gpt3: GPT-3 175B on a Pod256 (dp 4 x tp1 8 x tp2 8, `phases="auto"`), cost only, in a fresh
  child process: lower and compile seconds and the process's peak host memory.
* memory: the GPT step and a matmul chain compiled and run on a 16-tile and a 1,472-tile Bow, a
  child process each: peak host memory, which should not grow with the tile count.

Child processes are this file run with `--child KIND JSON`; each prints its figures as JSON. Peak
memory is the child's `VmHWM` (see `peak_memory_bytes`). Each section's goal is printed as met or
NOT met beside its figure; an unmet goal does not fail the run, an exception does. `--quick` runs
every section on tiny inputs (the tiny GPT on 2 IPUs of 16 tiles, its step's cost-only compile,
small matmuls) for the smoke test in `tests/bench/test_run.py`; its figures mean nothing.

    python benchmarks/run.py                                  # everything; writes RESULTS.md
    python benchmarks/run.py --only run,compile --repeats 3 --no-write
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before jax is imported, here or by spmd_compare

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import spmd_compare  # noqa: E402  (puts the repository and examples/ on sys.path)
from jax.sharding import PartitionSpec as P  # noqa: E402

import ipujax  # noqa: E402

REPO = spmd_compare.REPO
RESULTS = HERE / "RESULTS.md"
SECTIONS = ("run", "compile", "spmd", "gpt3", "memory")
MiB = 1 << 20
COST_NAMES = {"gpt3_175b": "GPT-3 175B", "step": "The GPT step"}
PEAK_MEMORY = (
    "Peak memory is `VmHWM` of the child's /proc/self/status, the high-water mark of its own "
    "address space, not `getrusage(RUSAGE_SELF).ru_maxrss`: on Linux a child's `ru_maxrss` "
    "starts at its parent's peak, which is carried across exec"
)

# Goals; each is printed as met or NOT met beside its figure.
AGREE_ATOL = 1e-4  # ipujax's outputs against jax.jit's (parameters, Adam's moments, loss)
RUN_RATIO_GOAL = 1.5  # ipujax warm call / jax.jit warm call
COMPILE_RATIO_GOAL = 3.0  # ipujax lower + compile + runtime compile / jax.jit lower + compile
GPT3_SECONDS_GOAL = 60.0  # lower + compile
GPT3_MEMORY_GOAL = 4 << 30  # peak host memory (bytes)
MEMORY_RATIO_GOAL = 1.25  # memory above the baseline, most tiles / fewest tiles


def log(message: str) -> None:
    """A progress line on stderr, stamped with the seconds since the runner started."""
    print(f"[{time.perf_counter() - _START:7.1f} s] {message}", file=sys.stderr, flush=True)


_START = time.perf_counter()


# ---- what to measure --------------------------------------------------------------------------


@dataclass(frozen=True)
class MeshSpec:
    shape: tuple[int, ...]
    names: tuple[str, ...]

    @property
    def ipus(self) -> int:
        return math.prod(self.shape)

    @property
    def label(self) -> str:
        axes = " x ".join(f"{n}={s}" for n, s in zip(self.names, self.shape, strict=True))
        return f"{self.ipus} IPU" if self.ipus == 1 else f"{self.ipus} IPUs ({axes})"


ONE_IPU = MeshSpec((1,), ("ipu",))  # ipujax's default mesh


@dataclass(frozen=True)
class Setup:
    """Everything the sections measure: the full benchmark (`FULL`) or a smoke run (`QUICK`)."""

    config: dict[str, int]  # model.Config fields of the GPT step
    batch: int  # global batch
    tiles: int | None  # tiles per IPU; None is the full Bow (1,472)
    meshes: tuple[MeshSpec, ...]  # run and compile; those of many IPUs also spmd
    cost_workload: str  # for gpt3: a factory of examples/gpt/workloads.py, or "step"
    cost_mesh: MeshSpec
    compiles: int  # compiles per side and mesh; compile times are their medians
    memory_tiles: tuple[int, ...]
    memory_programs: tuple[str, ...]  # "gpt" (the step above), "matmul" (a chain)
    matmul: tuple[int, int]  # the matmul chain: size, depth

    @property
    def many(self) -> tuple[MeshSpec, ...]:
        return tuple(m for m in self.meshes if m.ipus > 1)


FULL = Setup(
    config={"vocab": 512, "seq": 128, "layers": 4, "d_model": 256, "heads": 8},
    batch=8,
    tiles=None,
    meshes=(ONE_IPU, MeshSpec((2, 2), ("dp", "tp")), MeshSpec((8, 8), ("dp", "tp"))),
    cost_workload="gpt3_175b",
    compiles=3,
    cost_mesh=MeshSpec((4, 8, 8), ("dp", "tp1", "tp2")),
    memory_tiles=(16, 1472),
    memory_programs=("gpt", "matmul"),
    matmul=(2048, 4),
)
QUICK = Setup(
    config={"vocab": 256, "seq": 16, "layers": 2, "d_model": 32, "heads": 4},
    batch=4,
    tiles=16,
    meshes=(MeshSpec((2,), ("tp",)),),
    cost_workload="step",  # the GPT step above, shapes only
    compiles=1,
    cost_mesh=MeshSpec((2, 2), ("dp", "tp")),
    memory_tiles=(16, 32),
    memory_programs=("matmul",),
    matmul=(128, 2),
)


# ---- the programs -----------------------------------------------------------------------------


def workloads() -> ModuleType:
    """examples/gpt/workloads.py, loaded by path under the name its own loader would use."""
    name = "gpt_example_workloads"
    if name not in sys.modules:
        path = REPO / "examples" / "gpt" / "workloads.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@dataclass(frozen=True)
class GptStep:
    """The GPT AdamW step's real arguments; `fresh()` is a new step function each time, so
    jax's caches keyed by the function cannot carry a compile from one measurement to the next."""

    config: Any
    optimizer: Any
    args: tuple[Any, Any, Any]  # params, opt_state, tokens

    def fresh(self) -> Callable[..., Any]:
        return workloads().model.make_train_step(self.optimizer)

    def specs(self, mesh: ipujax.Mesh) -> tuple[Any, Any]:
        """in_shardings from workloads.py; out_shardings pinned to the inputs' (loss replicated)."""
        params, opt_state, _ = self.args
        kwargs = workloads()._jit_kwargs(mesh, params, opt_state, self.config)
        in_specs = kwargs["in_shardings"]
        return in_specs, (in_specs[0], in_specs[1], P())


def bow(tiles: int | None) -> ipujax.Target:
    """A Bow IPU, of all its 1,472 tiles (None) or of `tiles`."""
    return ipujax.Target.bow() if tiles is None else ipujax.Target.bow().with_tiles(tiles)


def gpt_step(config_fields: dict[str, int], batch: int) -> GptStep:
    """The step with `model.Config(**config_fields)`, its initial parameters and optimizer
    state, and `batch` sequences of random tokens."""
    model = workloads().model
    config = model.Config(**config_fields)
    optimizer = model.make_optimizer()
    params = jax.jit(model.init, static_argnums=1)(jax.random.key(0), config)  # one dispatch
    tokens = np.random.default_rng(0).integers(
        0, config.vocab, (batch, config.seq + 1), dtype=np.int32
    )
    return GptStep(config, optimizer, (params, optimizer.init(params), tokens))


def matmul_chain(size: int, depth: int) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """x -> tanh(x @ w) `depth` times, on [size, size] f32 matrices."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((size, size), np.float32)
    scale = np.float32(1 / np.sqrt(size))  # a float64 scalar would make the weights float64
    ws = [scale * rng.standard_normal((size, size), np.float32) for _ in range(depth)]

    def chain(x: jax.Array, ws: list[jax.Array]) -> jax.Array:
        for w in ws:
            x = jnp.tanh(x @ w)
        return x

    return chain, (x, ws)


def ipujax_kwargs(step: GptStep, mesh: ipujax.Mesh) -> dict[str, Any]:
    if mesh.ipus == 1:
        return {"mesh": mesh}
    in_specs, out_specs = step.specs(mesh)
    return {"mesh": mesh, "in_shardings": in_specs, "out_shardings": out_specs}


# ---- measuring ---------------------------------------------------------------------------------


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
    """Runs `kind` in a fresh Python process (this file with `--child`); with `devices`, jax there
    has that many forced host devices. Returns the JSON the child prints last."""
    argv = [str(Path(__file__).resolve()), "--child", kind, json.dumps(payload)]
    return spmd_compare.run_json_child(argv, devices, kind, timeout=1800)


# ---- run and compile: ipujax.jit against jax.jit in this process -------------------------------


@dataclass
class MeshRun:
    """One mesh's figures; compile times are lists, one entry per compile (`Setup.compiles`)."""

    mesh: MeshSpec
    jax_compile: list[float] = field(default_factory=list)  # jax.jit(step).lower().compile()
    jax_first: list[float] = field(default_factory=list)  # first call of jax's executable
    ipujax_lower: list[float] = field(default_factory=list)
    ipujax_compile: list[float] = field(default_factory=list)
    ipujax_first: list[float] = field(default_factory=list)  # with the runtime's XLA compile
    ipujax_warm: list[float] = field(default_factory=list)
    jax_warm: list[float] = field(default_factory=list)
    diff: float = math.nan  # max |ipujax - jax| over every output
    loss: float = math.nan  # jax.jit's
    collectives: list[spmd_compare.Collective] = field(default_factory=list)

    @property
    def ipujax_median(self) -> float:
        return statistics.median(self.ipujax_warm)

    @property
    def jax_median(self) -> float:
        return statistics.median(self.jax_warm)

    @property
    def run_ratio(self) -> float:
        return self.ipujax_median / self.jax_median

    @property
    def runtime_compile(self) -> float:
        """The first call minus a warm one: the runtime's XLA compile, mostly."""
        return statistics.median(self.ipujax_first) - self.ipujax_median

    @property
    def ipujax_compile_total(self) -> float:
        median = statistics.median
        return median(self.ipujax_lower) + median(self.ipujax_compile) + self.runtime_compile

    @property
    def compile_ratio(self) -> float:
        return self.ipujax_compile_total / statistics.median(self.jax_compile)

    @property
    def jax_first_extra(self) -> float:
        return statistics.median(self.jax_first) - self.jax_median


def compile_both(step: GptStep, mesh: ipujax.Mesh, result: MeshRun) -> tuple[Any, Any]:
    """jax.jit's and ipujax's compile of fresh step functions, each called once; the times go
    into `result`. Returns (jax's executable, ipujax's Compiled)."""
    args, label = step.args, result.mesh.label
    log(f"run: {label}: jax.jit lower + compile")
    seconds, executable = timed(lambda: jax.jit(step.fresh()).lower(*args).compile(), block=False)
    result.jax_compile.append(seconds)
    jitted = ipujax.jit(step.fresh(), **ipujax_kwargs(step, mesh))
    lower, lowered = timed(lambda: jitted.lower(*args), block=False)
    log(f"run: {label}: ipujax compile ({lower:.1f} s to lower; jax.jit took {seconds:.1f} s)")
    compile_, compiled = timed(lowered.compile, block=False)
    log(f"run: {label}: ipujax first call ({compile_:.1f} s to compile)")
    first, _ = timed(lambda: compiled(*args))
    result.ipujax_lower.append(lower)
    result.ipujax_compile.append(compile_)
    result.ipujax_first.append(first)
    result.jax_first.append(timed(lambda: executable(*args))[0])
    return executable, compiled


def measure_mesh(setup: Setup, step: GptStep, spec: MeshSpec, repeats: int) -> MeshRun:
    """Both sides compiled `setup.compiles` times (jax first, fresh functions each time) and
    called once each time; then `repeats` warm calls of the last compile of each, interleaved
    (ipujax, jax, ipujax, jax, ...) so that machine noise hits both alike."""
    args = step.args
    mesh = ipujax.make_mesh(spec.shape, spec.names, target=bow(setup.tiles))
    result = MeshRun(spec)
    for _ in range(setup.compiles):
        executable, compiled = compile_both(step, mesh, result)
    log(f"run: {spec.label}: {repeats} warm calls each")
    for _ in range(repeats):
        seconds, ours = timed(lambda: compiled(*args))
        result.ipujax_warm.append(seconds)
        seconds, theirs = timed(lambda: executable(*args))
        result.jax_warm.append(seconds)
    result.diff = max_abs_diff(ours, theirs)
    result.loss = float(theirs[2])
    result.collectives = spmd_compare.ipujax_collectives(compiled)
    log(
        f"run: {spec.label}: ipujax {result.ipujax_median:.3f} s, jax {result.jax_median:.3f} s, "
        f"max |diff| {result.diff:.2e}"
    )
    return result


def warm_up_jax() -> None:
    """jax's one-time start-up costs (backend, first compile), paid before anything is timed."""
    jax.block_until_ready(jax.jit(lambda x: x * 2 + 1)(np.float32(1)))


# ---- children: XLA's SPMD partitioner, GPT-3's cost, memory per tile count ----------------------


def child_xla(payload: dict[str, Any]) -> dict[str, Any]:
    """The GPT step under jax.jit with NamedShardings over forced host devices (XLA's SPMD
    partitioner), with the PartitionSpecs ipujax gets: compile, warm calls, collectives."""
    from jax.sharding import Mesh, NamedSharding

    spec = MeshSpec(tuple(payload["shape"]), tuple(payload["names"]))
    step = gpt_step(payload["config"], payload["batch"])
    in_specs, out_specs = step.specs(ipujax.make_mesh(spec.shape, spec.names))
    devices = jax.devices()
    if len(devices) < spec.ipus:
        raise RuntimeError(f"{spec.label} needs {spec.ipus} devices, jax has {len(devices)}")
    mesh = Mesh(np.asarray(devices[: spec.ipus]).reshape(spec.shape), spec.names)

    def shardings(tree: Any) -> Any:
        return jax.tree.map(
            lambda s: NamedSharding(mesh, s), tree, is_leaf=lambda s: isinstance(s, P)
        )

    warm_up_jax()
    jitted = jax.jit(
        step.fresh(), in_shardings=shardings(in_specs), out_shardings=shardings(out_specs)
    )
    compile_, executable = timed(lambda: jitted.lower(*step.args).compile(), block=False)
    args = jax.device_put(step.args, shardings(in_specs))
    first, out = timed(lambda: executable(*args))
    warm = [timed(lambda: executable(*args))[0] for _ in range(payload["repeats"])]
    collectives = spmd_compare.hlo_collectives(executable, spec.ipus)
    return {
        "compile": compile_,
        "first": first,
        "warm": warm,
        "loss": float(out[2]),
        "collectives": [asdict(c) for c in collectives],
    }


def cost_workload(payload: dict[str, Any], mesh: ipujax.Mesh) -> tuple[Any, Any, Any]:
    """(fun, args, jit kwargs) of a factory of workloads.py, or for "step" the payload's GPT
    step, shapes only, with `batch` sequences per dp replica."""
    if payload["workload"] != "step":
        return getattr(workloads(), payload["workload"])(mesh)
    config = workloads().model.Config(**payload["config"])
    return workloads().training_step(config, payload["batch"], mesh)


def child_cost(payload: dict[str, Any]) -> dict[str, Any]:
    """A workload of examples/gpt/workloads.py compiled for cost only, phases="auto"."""
    baseline = peak_memory_bytes()
    spec = MeshSpec(tuple(payload["shape"]), tuple(payload["names"]))
    mesh = ipujax.make_mesh(spec.shape, spec.names)
    build, (fun, args, kwargs) = timed(lambda: cost_workload(payload, mesh), block=False)
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


CHILDREN: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "xla": child_xla,
    "cost": child_cost,
    "memory": child_memory,
}


def setup_payload(setup: Setup) -> dict[str, Any]:
    """The fields of `setup` the children need (meshes are passed on their own)."""
    return {"config": setup.config, "batch": setup.batch, "matmul": list(setup.matmul)}


# ---- tables ------------------------------------------------------------------------------------


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table, padded so that it also reads as plain text."""
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def goal(met: bool) -> str:
    return "met" if met else "NOT met"


def mib(n: float) -> str:
    return f"{n / MiB:,.0f}"


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    table: str
    meaning: str  # what each number means, for RESULTS.md
    goals: tuple[tuple[str, bool], ...] = ()  # (what, met)
    notes: tuple[str, ...] = ()  # lines printed under the table


def run_section(runs: Sequence[MeshRun], repeats: int) -> Section:
    header = (
        "mesh",
        "ipujax s",
        "jax.jit s",
        "ratio",
        f"goal <= {RUN_RATIO_GOAL}",
        "fastest ipujax / jax s",
        "max abs diff",
    )
    rows = [
        (
            r.mesh.label,
            f"{r.ipujax_median:.3f}",
            f"{r.jax_median:.3f}",
            f"{r.run_ratio:.2f}",
            goal(r.run_ratio <= RUN_RATIO_GOAL),
            f"{min(r.ipujax_warm):.3f} / {min(r.jax_warm):.3f}",
            f"{r.diff:.1e}",
        )
        for r in runs
    ]
    meaning = (
        f"Seconds per GPT training step, the median of {repeats} warm calls of each side "
        "(`jax.block_until_ready` on the results), ipujax's and jax.jit's calls alternating. "
        "ipujax runs the step tile by tile on virtual Bow IPUs (on many IPUs, the "
        "per-IPU program vmapped over the mesh axes, collectives included); jax.jit runs the "
        "same step as XLA compiled it for the CPU, unpartitioned. ratio = ipujax / jax.jit. "
        "fastest: the quickest warm call of each side. max abs diff: the largest absolute "
        "difference between the two sides' outputs (parameters, optimizer state and loss) "
        "after one step from the same inputs."
    )
    goals = tuple(
        (f"run time ratio, {r.mesh.label}: {r.run_ratio:.2f}", r.run_ratio <= RUN_RATIO_GOAL)
        for r in runs
    )
    worst = max(r.diff for r in runs)
    goals += ((f"outputs agree with jax.jit: max abs diff {worst:.1e}", worst <= AGREE_ATOL),)
    title = "Run time: GPT AdamW step, ipujax.jit against jax.jit"
    return Section("run", title, markdown_table(header, rows), meaning, goals)


def compile_section(runs: Sequence[MeshRun], compiles: int) -> Section:
    header = (
        "mesh",
        "ipujax lower s",
        "compile s",
        "runtime XLA s",
        "ipujax total s",
        "jax.jit s",
        "ratio",
        f"goal <= {COMPILE_RATIO_GOAL:g}",
        "jax 1st call extra s",
    )
    rows = [
        (
            r.mesh.label,
            f"{statistics.median(r.ipujax_lower):.2f}",
            f"{statistics.median(r.ipujax_compile):.2f}",
            f"{r.runtime_compile:.2f}",
            f"{r.ipujax_compile_total:.2f}",
            f"{statistics.median(r.jax_compile):.2f}",
            f"{r.compile_ratio:.2f}",
            goal(r.compile_ratio <= COMPILE_RATIO_GOAL),
            f"{r.jax_first_extra:.2f}",
        )
        for r in runs
    ]
    meaning = (
        f"Seconds, the median of {compiles} compiles of each side per mesh, the two sides "
        "alternating, jax's start-up paid beforehand and each compile of a fresh step function "
        "(so that none reuses another's trace or executable). "
        "ipujax total = lower + compile + runtime XLA: `jitted.lower(*args)` (trace to "
        "StableHLO, import to ipujax's IR, check the shardings), `.compile()` (propagate and "
        "partition over the mesh, tile layouts and supersteps, memory and cost report, build the "
        "runtime's jax function) and the first call minus the median warm call (the runtime's "
        "own jax.jit trace and XLA compile of the tile program, which happen lazily at the first "
        "call). jax.jit = `jax.jit(step).lower(*args).compile()`: trace, StableHLO and XLA's "
        "CPU compile. ratio = ipujax total / jax.jit. jax 1st call extra: how much longer the "
        "first call of jax's compiled executable took than its median warm call; it is not "
        "counted in jax.jit's figure (ipujax's first-call overhead is in its runtime XLA figure)."
    )
    goals = tuple(
        (
            f"compile time ratio, {r.mesh.label}: {r.compile_ratio:.2f}",
            r.compile_ratio <= COMPILE_RATIO_GOAL,
        )
        for r in runs
    )
    title = "Compile time: ipujax (lower + compile + runtime compile) against jax.jit"
    return Section("compile", title, markdown_table(header, rows), meaning, goals)


def spmd_section(setup: Setup, runs: Sequence[MeshRun], repeats: int) -> Section:
    header = (
        "mesh",
        "XLA compile s",
        "XLA SPMD s",
        "ipujax s",
        "XLA collectives",
        "XLA B/device",
        "ipujax collectives",
        "ipujax B/IPU",
        "bytes ipujax/XLA",
        "loss diff",
    )
    rows, notes = [], []
    for r in runs:
        log(f"spmd: {r.mesh.label}: XLA's SPMD partitioner in a child process")
        payload = {**setup_payload(setup), "shape": r.mesh.shape, "names": r.mesh.names}
        data = run_child("xla", {**payload, "repeats": repeats}, devices=r.mesh.ipus)
        xla = spmd_compare.Side(tuple(spmd_compare.Collective(**c) for c in data["collectives"]))
        ours = spmd_compare.Side(tuple(r.collectives))
        ratio = ours.bytes / xla.bytes if xla.bytes else math.inf
        notes.append(f"{r.mesh.label}, bytes per device by kind: {by_kind(xla, ours)}")
        rows.append(
            (
                r.mesh.label,
                f"{data['compile']:.2f}",
                f"{statistics.median(data['warm']):.3f}",
                f"{r.ipujax_median:.3f}",
                xla.counts_text(),
                f"{xla.bytes:,}",
                ours.counts_text(),
                f"{ours.bytes:,}",
                f"{ratio:.2f}",
                f"{abs(data['loss'] - r.loss):.1e}",
            )
        )
    meaning = (
        "XLA's SPMD partitioner on the same step with the same PartitionSpecs (the parameters and "
        "optimizer state as `examples/gpt/sharding.py` shards them, tokens over dp; outputs "
        "pinned to the inputs' specs on both sides, the loss replicated), as `jax.jit` with "
        "`NamedSharding`s over a `jax.sharding.Mesh` of that many forced host devices (a child "
        "process started with `XLA_FLAGS=--xla_force_host_platform_device_count=N`). XLA compile "
        f"s: its lower + compile; XLA SPMD s: the median of {repeats} warm calls, every device "
        "sharing this machine's cores; ipujax s: the run table's figure. Collectives by kind "
        "(XLA: instructions of the partitioned HLO, which its combiner may have merged; ipujax: "
        "collective ops) and bytes each device sends over a program step, both by the ring "
        "closed forms of `partitioner.links.ring_bytes`, as `benchmarks/spmd_compare.py` counts "
        "them. loss diff: |XLA SPMD's loss - jax.jit's|."
    )
    title = "XLA's SPMD partitioner on the same steps"
    return Section("spmd", title, markdown_table(header, rows), meaning, notes=tuple(notes))


def by_kind(xla: spmd_compare.Side, ours: spmd_compare.Side) -> str:
    """Each side's bytes per device by collective kind, as text."""
    return "; ".join(
        f"{label} " + ", ".join(f"{kind} {sent:,}" for kind, sent in side.bytes_by_kind.items())
        for label, side in (("XLA", xla), ("ipujax", ours))
    )


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


# ---- the machine, RESULTS.md and the command line ---------------------------------------------


def _first_line(path: str, prefix: str) -> str:
    """The rest of the first line of `path` that starts with `prefix`, or '?'."""
    try:
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                if line.startswith(prefix):
                    return line.split(":", 1)[-1].split("=", 1)[-1].strip().strip('"')
    except OSError:
        pass
    return "?"


def _git(*args: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
    )
    return proc.stdout.strip() if proc.returncode == 0 else "?"


def load_average() -> str:
    """Other work on the machine skews every timing; RESULTS.md records how much there was."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> list[tuple[str, str]]:
    """What the figures were measured on."""
    ram_kib = _first_line("/proc/meminfo", "MemTotal").split()[0]
    ram = f"{int(ram_kib) / (1 << 20):.1f} GiB" if ram_kib.isdigit() else "?"
    changed = len(_git("status", "--porcelain", "--untracked-files=no").splitlines())
    commit = _git("rev-parse", "--short", "HEAD")
    return [
        ("CPU", _first_line("/proc/cpuinfo", "model name")),
        ("cores", f"{os.cpu_count()} ({len(os.sched_getaffinity(0))} usable)"),
        ("RAM", ram),
        ("OS", f"{_first_line('/etc/os-release', 'PRETTY_NAME')}, Linux {platform.release()}"),
        ("Python", platform.python_version()),
        ("jax / jaxlib", f"{jax.__version__} / {importlib.metadata.version('jaxlib')}"),
        ("ipujax", f"commit {commit}" + (f", {changed} files changed" if changed else "")),
        ("load average (1, 5, 15 min) at the start", load_average()),
        ("date", datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")),
    ]


def render(
    sections: Sequence[Section],
    about: Sequence[tuple[str, str]],
    command: str,
    timings: dict[str, float],
) -> str:
    """RESULTS.md."""
    goals = [g for s in sections for g in s.goals]
    lines = [
        "# Benchmark results",
        "",
        "Written by `benchmarks/run.py` (`make bench`); rerun it rather than editing this file.",
        "",
        "## Machine",
        "",
        *(f"- {key}: {value}" for key, value in about),
        "",
        "## Command",
        "",
        f"    {command}",
        "",
        "Wall time: "
        + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in timings.items())
        + ". Sections run: "
        + ", ".join(s.name for s in sections)
        + ".",
        "",
        "## Goals",
        "",
        *(f"- {goal(met)}: {what}" for what, met in goals),
    ]
    for section in sections:
        lines += ["", f"## {section.title}", "", section.table]
        lines += ["", *(f"- {note}" for note in section.notes)] if section.notes else []
    lines += ["", "## What each number means"]
    for section in sections:
        lines += ["", f"**{section.title}.** {section.meaning}"]
    return "\n".join(lines) + "\n"


def write_atomically(path: Path, text: str) -> None:
    """`text` to a temporary file beside `path`, then renamed over it: readers see the old
    file or the new one, never half of one."""
    with tempfile.NamedTemporaryFile(
        "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", delete=False
    ) as out:
        out.write(text)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(out.name, 0o666 & ~umask)  # as open() would have made it, not mkstemp's 0600
    os.replace(out.name, path)


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
        "spmd": lambda: spmd_section(setup, [r for r in runs if r.mesh.ipus > 1], repeats),
        "gpt3": lambda: gpt3_section(setup),
        "memory": lambda: memory_section(setup),
    }
    sections = []
    for name in (n for n in SECTIONS if n in only):
        start = time.perf_counter()
        sections.append(builders[name]())
        if name in ("spmd", "gpt3", "memory"):
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
    start = time.perf_counter()
    timings: dict[str, float] = {}
    sections = measure(QUICK if args.quick else FULL, args.only, args.repeats, timings)
    timings["total"] = time.perf_counter() - start
    about.insert(-1, ("load average (1, 5, 15 min) at the end", load_average()))
    print("\n## Goals\n")
    for what, met in (g for s in sections for g in s.goals):
        print(f"- {goal(met)}: {what}")
    print(f"\ntotal {timings['total']:.0f} s")
    if not args.no_write:
        write_atomically(RESULTS, render(sections, about, command, timings))
        log(f"wrote {RESULTS.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The loops section: programs built around a loop (ipujax issue 34). The gradient of a stack of
layers written as one `lax.scan`, a fresh function's first call through `ipujax.jit` on a
data-parallel mesh against `jax.jit`'s (`measure_scan`), and GPT-3 175B at PopXL's batch (32
micro-batches summed by a scan) on a Bow Pod256, compiled for cost only in a fresh child process
(`child_popxl`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from gpt3 import costed
from jax.sharding import PartitionSpec as P
from measuring import PEAK_MEMORY, log, run_child
from programs import bow, workloads
from results import Section, goal, markdown_table, mib
from setups import MeshSpec, Setup
from timing import (
    FIRST_CALL_COLUMNS,
    FIRST_CALL_RATIO_GOAL,
    MeshRun,
    first_call_cells,
    first_calls,
)

import ipujax

# Goals (issue 34); each is printed as met or NOT met beside its figure.
SCAN_RATIO_GOAL = 2.0  # ipujax lower + compile + first call / jax.jit's the same
POPXL_SECONDS_GOAL = 300.0  # lower + compile (+ the cost report) of GPT-3 at PopXL's batch
POPXL_WORKLOAD = "gpt3_175b_popxl"  # a factory of examples/gpt/workloads.py


@dataclass(frozen=True)
class ScanProgram:
    """A loss's gradient over stacked layer weights, the layers one `lax.scan`; `fresh()` is a
    new gradient function each time, so that no compile reuses another's trace or executable."""

    label: str
    loss: Callable[[], Callable[..., jax.Array]]  # a new loss(weights, x) each call
    args: tuple[Any, Any]  # weights (stacked along the layers), x (the batch first)

    def fresh(self) -> Callable[..., Any]:
        return jax.grad(self.loss())


def _stacked(rng: np.random.Generator, layers: int, shape: tuple[int, int]) -> np.ndarray:
    """`layers` random [fan in, fan out] f32 matrices, scaled by 1 / sqrt(fan in)."""
    return np.float32(1 / np.sqrt(shape[0])) * rng.standard_normal((layers, *shape), np.float32)


def scan_mlp(layers: int, width: int, batch: int) -> ScanProgram:
    """mean(h ** 2) after `layers` times h -> tanh(h @ w), w [width, width], h [batch, width]."""
    rng = np.random.default_rng(0)
    ws = _stacked(rng, layers, (width, width))  # scaled: tanh stays out of saturation
    x = rng.standard_normal((batch, width), np.float32)

    def loss() -> Callable[..., jax.Array]:
        def mlp(ws: jax.Array, x: jax.Array) -> jax.Array:
            h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)
            return jnp.mean(h**2)

        return mlp

    label = f"scan MLP: {layers} layers of [{width}, {width}], batch {batch}"
    return ScanProgram(label, loss, (ws, x))


def _normalized(x: jax.Array) -> jax.Array:
    """Layer norm without its scale and shift."""
    mean = jnp.mean(x, -1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(jnp.var(x, -1, keepdims=True) + 1e-5)


def _block(heads: int) -> Callable[[jax.Array, dict[str, jax.Array]], tuple[jax.Array, None]]:
    """A pre-norm transformer block (causal attention, then a GELU MLP), as a scan's body."""

    def block(h: jax.Array, w: dict[str, jax.Array]) -> tuple[jax.Array, None]:
        batch, seq, d_model = h.shape
        x = _normalized(h)
        q, k, v = (
            (x @ w[name]).reshape(batch, seq, heads, d_model // heads) for name in ("q", "k", "v")
        )
        scores = jnp.einsum("bshd,bthd->bhst", q, k) / np.sqrt(d_model // heads)
        causal = jnp.tril(jnp.ones((seq, seq), bool))
        attention = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        mixed = jnp.einsum("bhst,bthd->bshd", attention, v).reshape(batch, seq, d_model)
        h = h + mixed @ w["o"]
        return h + jax.nn.gelu(_normalized(h) @ w["up"]) @ w["down"], None

    return block


def scan_transformer(layers: int, seq: int, d_model: int, heads: int, batch: int) -> ScanProgram:
    """mean(h ** 2) after `layers` transformer blocks (no flax: plain jax.numpy) in one scan."""
    rng = np.random.default_rng(0)
    shapes = {
        "q": (d_model, d_model),
        "k": (d_model, d_model),
        "v": (d_model, d_model),
        "o": (d_model, d_model),
        "up": (d_model, 4 * d_model),
        "down": (4 * d_model, d_model),
    }
    weights = {name: _stacked(rng, layers, shape) for name, shape in shapes.items()}
    x = rng.standard_normal((batch, seq, d_model), np.float32)

    def loss() -> Callable[..., jax.Array]:
        body = _block(heads)

        def transformer(weights: dict[str, jax.Array], x: jax.Array) -> jax.Array:
            h, _ = jax.lax.scan(body, x, weights)
            return jnp.mean(h**2)

        return transformer

    label = f"scan transformer: {layers} blocks, d_model {d_model}, seq {seq}, batch {batch}"
    return ScanProgram(label, loss, (weights, x))


def scan_programs(setup: Setup) -> tuple[ScanProgram, ...]:
    layers, width, batch = setup.scan
    return scan_mlp(layers, width, batch), scan_transformer(**setup.scan_transformer)


def megatron_specs(mesh: ipujax.Mesh) -> tuple[dict[str, Any], Any]:
    """`scan_transformer`'s stacked block weights as Megatron lays them over a tp axis (q, k, v
    and up split by columns, o and down by rows) and its batch over a dp axis."""
    tp = "tp" if "tp" in mesh.axis_names else None
    columns, rows = P(None, None, tp), P(None, tp, None)
    weights = {"q": columns, "k": columns, "v": columns, "up": columns, "o": rows, "down": rows}
    return weights, P("dp") if "dp" in mesh.axis_names else None


def measure_scan(
    setup: Setup,
    program: ScanProgram,
    spec: MeshSpec | None = None,
    layout: Callable[[ipujax.Mesh], Any] | None = None,
) -> MeshRun:
    """`setup.compiles` fresh compiles and first calls of each side, the two alternating, on
    `spec` (by default `setup.scan_ipus` data-parallel IPUs), the arguments laid out by
    `layout(mesh)` (by default the batch over dp, the weights left to propagation)."""
    spec = spec or MeshSpec((setup.scan_ipus,), ("dp",))
    mesh = ipujax.make_mesh(spec.shape, spec.names, target=bow(setup.tiles))
    shardings = layout(mesh) if layout is not None else (None, P("dp"))
    result = MeshRun(spec)
    for i in range(setup.compiles):
        log(f"loops: {program.label} on {spec.label}: compile {i + 1} of {setup.compiles}")
        first_calls(program.fresh, program.args, mesh, shardings, result)
    log(
        f"loops: {program.label} on {spec.label}: ipujax {result.ipujax_first_call:.2f} s, "
        f"jax.jit {result.jax_first_call:.2f} s, max |diff| {result.diff:.1e}"
    )
    return result


def child_popxl(payload: dict[str, Any]) -> dict[str, Any]:
    """GPT-3 175B at PopXL's batch, `payload["layers"]` deep, on full Bow IPUs, compiled for
    cost only with phases="auto"."""
    spec = MeshSpec(tuple(payload["shape"]), tuple(payload["names"]))
    mesh = ipujax.make_mesh(spec.shape, spec.names, target=ipujax.Target.bow())
    factory = getattr(workloads(), POPXL_WORKLOAD)
    return costed(lambda: factory(mesh, layers=payload["layers"]))


def measure_popxl(setup: Setup) -> dict[str, Any]:
    spec = setup.popxl_mesh
    log(f"loops: {POPXL_WORKLOAD}, {setup.popxl_layers} layers, on {spec.label}, in a child")
    payload = {"layers": setup.popxl_layers, "shape": spec.shape, "names": spec.names}
    return run_child("popxl", payload)


HEADER = (
    "program",
    "mesh",
    *FIRST_CALL_COLUMNS,
    "goal",
    "peak MiB",
    "simulated step",
    "fits",
    "max abs diff",
)


def scan_row(program: ScanProgram, run: MeshRun, bound: float = SCAN_RATIO_GOAL) -> tuple[str, ...]:
    met = goal(run.first_call_ratio <= bound)
    return (
        f"{program.label}, gradient",
        run.mesh.label,
        *first_call_cells(run),
        f"ratio <= {bound:g}: {met}",
        "-",
        "-",
        "-",
        f"{run.diff:.1e}",
    )


def popxl_row(setup: Setup, data: dict[str, Any]) -> tuple[str, ...]:
    total = data["lower"] + data["compile"]
    met = goal(total <= POPXL_SECONDS_GOAL)
    return (
        f"GPT-3 175B at PopXL's batch ({setup.popxl_layers} layers), cost only",
        setup.popxl_mesh.label,
        f"{data['lower']:.1f}",
        f"{data['compile']:.1f}",
        "-",
        f"{total:.1f}",
        "-",
        "-",
        f"total <= {POPXL_SECONDS_GOAL:g} s: {met}",
        mib(data["peak"]),
        f"{data['step_seconds']:.3f} s, {data['phases']} phases",
        "yes" if data["fits"] else "NO",
        "-",
    )


def loops_section(setup: Setup) -> Section:
    programs = scan_programs(setup)
    runs = [measure_scan(setup, p) for p in programs]
    # The scanned transformer at the run section's batch (it fits one IPU) on its meshes.
    meshed = scan_transformer(**{**setup.scan_transformer, "batch": setup.batch})
    on_meshes = [measure_scan(setup, meshed, spec, megatron_specs) for spec in setup.meshes]
    popxl = measure_popxl(setup)
    rows = [scan_row(p, r) for p, r in zip(programs, runs, strict=True)]
    rows += [scan_row(meshed, r, FIRST_CALL_RATIO_GOAL) for r in on_meshes]
    rows.append(popxl_row(setup, popxl))
    meaning = (
        "Scan rows: the gradient (wrt the stacked weights) of a loss whose layers are one "
        f"`lax.scan`, the batch split over the dp axis (`in_shardings=(None, P('dp'))`); the "
        f"median of {setup.compiles} compiles of fresh functions per side, the two sides "
        "alternating. ipujax total = `jitted.lower(*args)` + `.compile()` + the first call (in "
        "which the runtime's XLA compile happens); jax.jit total = "
        "`jax.jit(grad).lower(*args).compile()` + the first call, on the CPU; ratio = ipujax "
        "total / jax.jit total; max abs diff: between the two sides' gradients. The scan "
        f"transformer again at {setup.batch} sequences, on the run section's meshes, its "
        "stacked weights laid out over tp as Megatron lays them (q, k, v and up by columns, o "
        "and down by rows), the batch over dp (ipujax issue 39: at most "
        f"{FIRST_CALL_RATIO_GOAL:g}). GPT-3 row: "
        f"`workloads.{POPXL_WORKLOAD}(mesh, layers={setup.popxl_layers})` (PopXL's pretraining "
        "batch: 32 micro-batches of one sequence per replica summed by a scan, 128 sequences "
        'per step on dp=4; shapes only) through `ipujax.jit(fun, **kwargs, phases="auto")` on '
        "full Bow IPUs in a fresh child process: lower s, compile s (`.compile()` and "
        "`.cost_report()`) and their total (building the shapes, "
        f"{popxl['build']:.1f} s, is not counted); peak MiB: the child's peak resident memory "
        f"(baseline after its imports: {mib(popxl['baseline'])} MiB). {PEAK_MEMORY}. "
        "simulated step: the cost report's seconds per training step and its number of phases; "
        "fits: whether every tile's peak fits."
    )
    goals = tuple(
        (
            f"scan first call ratio, {p.label}: {r.first_call_ratio:.2f}",
            r.first_call_ratio <= SCAN_RATIO_GOAL,
        )
        for p, r in zip(programs, runs, strict=True)
    )
    goals += tuple(
        (
            f"scan first call ratio, {meshed.label}, {r.mesh.label}: {r.first_call_ratio:.2f}",
            r.first_call_ratio <= FIRST_CALL_RATIO_GOAL,
        )
        for r in on_meshes
    )
    total = popxl["lower"] + popxl["compile"]
    goals += (
        (f"GPT-3 at PopXL's batch compile: {total:.1f} s", total <= POPXL_SECONDS_GOAL),
        ("GPT-3 at PopXL's batch fits", bool(popxl["fits"])),
    )
    title = "Loops: a scan's gradient, first call, and GPT-3 at PopXL's batch, cost only"
    return Section("loops", title, markdown_table(HEADER, rows), meaning, goals)

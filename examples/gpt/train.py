"""Trains the GPT of `model.py` on a virtual IPU system with ipujax, with optax AdamW.

    python examples/gpt/train.py --mesh dp=2,tp=2 --steps 200 --check --plot loss.png
    python examples/gpt/train.py --mesh dp=2,tp1=2,tp2=2 --report step.json
    python examples/gpt/train.py --checkpoint ckpt/ --steps 400 --resume
    python examples/gpt/train.py --mesh dp=2,pp=2 --pipeline --microbatches 4 --steps 20
    python examples/gpt/train.py --fp16 --numerics ipu --lr 0.05 --steps 300

The data is byte-level text (vocabulary 256): by default every `*.py` file of the Python
standard library, concatenated in sorted order, so any machine has it without a download.

Every step runs the compiled program on the simulated IPUs (`ipujax.jit`); `--check` runs it with
`jax.jit` too and fails when the losses differ beyond rounding. The progress bar shows the loss,
the simulator's tokens/s (wall clock on this CPU) and the simulated IPU system's tokens/s (tokens
per step / the cost report's seconds per step). `--pipeline` pipelines the step over the mesh's
`pp` axis with `ipujax.Pipeline`, one stage per IPU of the axis, the global batch cut into
`--microbatches` micro-batches (the values are jax.jit's: pipelining reorders work only).
`--fp16` trains in pure float16 with loss scaling (`fp16.py`), and `--numerics ipu` rounds its
float16 results stochastically, as the IPU does (`ipujax.jit(numerics="ipu")`).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import ipujax

if (EXAMPLES := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, EXAMPLES)  # examples/, for `shared`: see shared/__init__.py
from shared import flags, load, meshes
from shared.files import write_atomic
from shared.flags import UsageError, positive
from shared.progress import Progress, Throughput, announce_compiled
from shared.transformer import layer_names

model = load.example("gpt", "model")
sharding = load.example("gpt", "sharding")
workloads = load.example("gpt", "workloads")
fp16 = load.example("gpt", "fp16")

CHECKPOINT_FILE = "checkpoint.npz"

# Flags a checkpoint fixes: a resumed run takes them from the checkpoint.
MODEL_FLAGS = {"layers": 2, "d_model": 64, "heads": 4, "seq": 64}
RUN_FLAGS = {
    "batch": 8,
    "grad_accumulation": 1,
    "lr": 3e-3,
    "warmup": 20,
    "weight_decay": 0.1,
    "clip": 1.0,
    "seed": 0,
    "data": None,
    "fp16": False,
    "numerics": "exact",
}


# ---- flags ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = flags.parser(
        "Train a small GPT on a virtual IPU system with ipujax.",
        mesh_help="e.g. dp=2,tp=2 or dp=2,tp1=2,tp2=2 (default: 1 IPU)",
    )
    add = parser.add_argument
    add(
        "--phases",
        choices=["none", "auto", "layer"],
        default="none",
        help="phased execution: none, auto (ipujax cuts) or layer (a phase per block)",
    )
    for flag, default in MODEL_FLAGS.items():
        add(f"--{flag.replace('_', '-')}", type=positive, default=None, help=f"default {default}")
    add("--batch", type=positive, default=None, help=f"global batch (default {RUN_FLAGS['batch']})")
    add(
        "--grad-accumulation",
        type=positive,
        default=None,
        metavar="N",
        help="split the batch into N micro-batches and sum their gradients (default 1)",
    )
    flags.add_pipeline(parser)
    add("--steps", type=positive, default=200, help="train until this step (default 200)")
    add("--lr", type=float, default=None, help=f"peak learning rate (default {RUN_FLAGS['lr']})")
    add("--warmup", type=int, default=None, help="linear warmup steps (default 20)")
    add("--weight-decay", type=float, default=None, help="AdamW weight decay (default 0.1)")
    add("--clip", type=float, default=None, help="global gradient-norm clip, 0 for none (1.0)")
    add("--seed", type=int, default=None, help="initialisation and data seed (default 0)")
    add("--data", default=None, help="a text file or a folder of *.py (default: the stdlib)")
    add("--fp16", action="store_true", default=None, help="pure float16, SGD (fp16.py)")
    add("--numerics", choices=["exact", "ipu"], default=None, help="ipu: stochastic rounding")
    flags.add_check(parser)
    add("--plot", default=None, metavar="PATH.png", help="write the loss curve")
    add("--checkpoint", default=None, metavar="DIR", help="save a checkpoint here")
    add("--save-every", type=positive, default=100, help="checkpoint period in steps (default 100)")
    add("--resume", action="store_true", help="continue from the checkpoint in --checkpoint")
    flags.add_logging(parser)
    return parser


def settings(args: argparse.Namespace, saved: dict[str, Any] | None) -> dict[str, Any]:
    """The model and run settings: flags over defaults, or the checkpoint's when resuming (a
    flag that contradicts the checkpoint is an error)."""
    defaults = {**MODEL_FLAGS, **RUN_FLAGS}
    given = {k: getattr(args, k) for k in defaults if getattr(args, k) is not None}
    if saved is None:
        return {**defaults, **given}
    clash = {k: (v, saved[k]) for k, v in given.items() if saved.get(k) != v}
    if clash:
        what = ", ".join(
            f"--{k.replace('_', '-')} {v} (checkpoint: {s})" for k, (v, s) in clash.items()
        )
        raise UsageError(f"--resume continues the checkpoint's run; these flags differ: {what}")
    return {k: saved.get(k, defaults[k]) for k in defaults}


# ---- data -----------------------------------------------------------------------------------


def stdlib_sources() -> tuple[Path, list[Path]]:
    """Every *.py of the Python standard library (not site-packages), in sorted order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "__pycache__"}
    files = sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))
    return root, files


@functools.lru_cache(maxsize=4)
def load_corpus(path: str | None) -> tuple[np.ndarray, str]:
    """The training text as bytes (tokens 0..255), and a description of where it came from."""
    if path is None:
        root, files = stdlib_sources()
        where = f"{len(files)} *.py files of the standard library in {root}"
    elif Path(path).is_dir():
        files = sorted(Path(path).rglob("*.py"))
        where = f"{len(files)} *.py files in {path}"
    else:
        files, where = [Path(path)], path
    chunks = []
    for file in files:
        try:
            chunks.append(file.read_bytes())
        except OSError:
            continue  # an unreadable file is skipped, the rest is text enough
    data = np.frombuffer(b"".join(chunks), np.uint8)
    if data.size == 0:
        raise UsageError(f"--data {path}: no text found")
    return data, where


def sample_batch(data: np.ndarray, rng: np.random.Generator, batch: int, seq: int) -> np.ndarray:
    """`batch` random windows of seq + 1 bytes: the inputs and their next-token targets."""
    if data.size < seq + 2:
        raise UsageError(f"the text has {data.size} bytes, fewer than a window of {seq + 1}")
    starts = rng.integers(0, data.size - seq - 1, size=batch)
    return data[starts[:, None] + np.arange(seq + 1)].astype(np.int32)


# ---- checkpoints ----------------------------------------------------------------------------


def _named_leaves(prefix: str, tree: Any) -> dict[str, np.ndarray]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {prefix + jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def _restore(prefix: str, template: Any, saved: Any) -> Any:
    paths, treedef = jax.tree_util.tree_flatten_with_path(template)
    leaves = []
    for path, leaf in paths:
        key = prefix + jax.tree_util.keystr(path)
        if key not in saved.files:
            raise UsageError(f"the checkpoint has no {key}: it was written for another model")
        value = saved[key]
        if value.shape != np.shape(leaf) or value.dtype != np.dtype(leaf.dtype):
            raise UsageError(f"the checkpoint's {key} is {value.dtype}{list(value.shape)}")
        leaves.append(jnp.asarray(value))
    return jax.tree.unflatten(treedef, leaves)


def save_checkpoint(
    folder: str,
    params: Any,
    opt_state: Any,
    step: int,
    rng: np.random.Generator,
    run: dict[str, Any],
    losses: list[float],
) -> None:
    """Params, optimizer state, step, the data sampler's RNG state and the run's settings in
    one .npz, written atomically."""
    arrays: dict[str, Any] = {**_named_leaves("params", params)}
    arrays.update(_named_leaves("opt_state", opt_state))
    arrays["step"] = np.asarray(step, np.int64)
    arrays["rng"] = np.asarray(json.dumps(rng.bit_generator.state))
    arrays["run"] = np.asarray(json.dumps(run))
    arrays["losses"] = np.asarray(losses, np.float64)
    write_atomic(Path(folder) / CHECKPOINT_FILE, lambda f: np.savez(f, **arrays), ".npz")


def read_run(folder: str) -> dict[str, Any]:
    """The settings a checkpoint was trained with."""
    path = Path(folder) / CHECKPOINT_FILE
    if not path.is_file():
        raise UsageError(f"no checkpoint at {path}")
    with np.load(path) as saved:
        run: dict[str, Any] = json.loads(str(saved["run"]))
    return run


def config_of(run: dict[str, Any]) -> Any:
    return model.Config(
        layers=run["layers"],
        d_model=run["d_model"],
        heads=run["heads"],
        seq=run["seq"],
        dtype="float16" if run.get("fp16") else "float32",
    )


def load_checkpoint(folder: str) -> dict[str, Any]:
    """Everything `save_checkpoint` wrote, with params and optimizer state as pytrees."""
    run = read_run(folder)
    config = config_of(run)
    optimizer = make_optimizer(run)
    params_shape = jax.eval_shape(lambda: model.init(jax.random.key(0), config))
    state_shape = jax.eval_shape(lambda p: init_optimizer(run, optimizer, p), params_shape)
    with np.load(Path(folder) / CHECKPOINT_FILE) as saved:
        rng = np.random.default_rng()
        rng.bit_generator.state = json.loads(str(saved["rng"]))
        return {
            "params": _restore("params", params_shape, saved),
            "opt_state": _restore("opt_state", state_shape, saved),
            "step": int(saved["step"]),
            "rng": rng,
            "run": run,
            "config": config,
            "losses": [float(x) for x in saved["losses"]],
        }


# ---- training -------------------------------------------------------------------------------


def make_optimizer(run: dict[str, Any]) -> Any:
    if run.get("fp16"):
        return fp16.make_optimizer(run["lr"])
    return model.make_optimizer(
        lr=run["lr"], warmup=run["warmup"], weight_decay=run["weight_decay"], clip=run["clip"]
    )


def init_optimizer(run: dict[str, Any], optimizer: Any, params: Any) -> Any:
    init = fp16.init_optimizer if run.get("fp16") else model.init_optimizer
    return init(optimizer, params)


def check_batch(run: dict[str, Any], mesh: ipujax.Mesh, microbatches: int = 1) -> None:
    """Each micro-batch (of the accumulation, or of the pipeline) splits evenly over the
    data-parallel replicas."""
    dp = meshes.axis_size(mesh, "dp")
    count = run["grad_accumulation"] * microbatches
    parts = count * dp
    if run["batch"] % parts:
        raise UsageError(
            f"--batch {run['batch']} does not split into {count} "
            f"micro-batches over dp={dp}; use a multiple of {parts}"
        )


def pipeline_for(args: argparse.Namespace, mesh: ipujax.Mesh) -> ipujax.Pipeline | None:
    """`ipujax.Pipeline` over the mesh's pp axis with --pipeline, recomputing each stage."""
    if not args.pipeline:
        return None
    meshes.require_pipeline_axis(mesh)
    return meshes.pipeline(args.microbatches)


def phases_for(flag: str, config: Any) -> Any:
    return {"none": None, "auto": "auto", "layer": layer_names(config)}[flag]


_COMPILED: dict[Any, Any] = {}  # compiled steps, reused by runs in one process (tests)


def compile_step(
    run: dict[str, Any],
    mesh: ipujax.Mesh,
    phases: Any,
    params: Any,
    opt_state: Any,
    pipeline: ipujax.Pipeline | None = None,
) -> tuple[ipujax.Compiled, Any]:
    """The training step compiled for the mesh, and the same step under jax.jit."""
    key = (json.dumps(run, sort_keys=True), mesh, json.dumps(phases), pipeline)
    if key not in _COMPILED:
        if run.get("fp16"):
            step = fp16.make_train_step(make_optimizer(run))
        else:
            step = model.make_train_step(make_optimizer(run), run["grad_accumulation"])
        tokens = jax.ShapeDtypeStruct((run["batch"], run["seq"] + 1), jnp.int32)
        specs = sharding.train_specs(params, opt_state, mesh)
        jitted = ipujax.jit(
            step,
            mesh=mesh,
            in_shardings=specs,
            phases=phases,
            pipeline=pipeline,
            numerics=run["numerics"],
        )
        _COMPILED[key] = (jitted.lower(params, opt_state, tokens).compile(), jax.jit(step))
    return _COMPILED[key]


def write_plot(path: str, losses: list[float], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    steps = np.arange(1, len(losses) + 1)
    ax.plot(steps, losses, lw=0.8, alpha=0.5, label="loss per step")
    window = min(10, len(losses))
    if window > 1:
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1 :], smooth, lw=2, label=f"mean of {window} steps")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per byte)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    write_atomic(Path(path), lambda f: fig.savefig(f, format="png"), ".png")
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    return flags.run(train, build_parser(), argv)


def train(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    if args.resume and not args.checkpoint:
        raise UsageError("--resume needs --checkpoint DIR")
    resumed = load_checkpoint(args.checkpoint) if args.resume else None
    run = settings(args, resumed["run"] if resumed else None)
    config = config_of(run)
    mesh = meshes.make_mesh(args, args.mesh or meshes.ONE_IPU, "NAME=SIZE,... such as dp=2,tp=2")
    with meshes.mesh_errors(args.mesh):
        sharding.check_divisible(mesh, config.heads)
        sharding.strategy(mesh)
    pipeline = pipeline_for(args, mesh)
    if pipeline is not None and run["grad_accumulation"] > 1:
        raise UsageError("--pipeline accumulates over its --microbatches; drop --grad-accumulation")
    check_batch(run, mesh, pipeline.microbatches if pipeline else 1)
    if args.check and run["numerics"] != "exact":
        raise UsageError("--check compares with jax.jit's numbers; it needs --numerics exact")
    data, where = load_corpus(run["data"])

    if resumed:
        params, opt_state, rng = resumed["params"], resumed["opt_state"], resumed["rng"]
        start, losses = resumed["step"], resumed["losses"]
    else:
        params = model.init(jax.random.key(run["seed"]), config)
        opt_state = init_optimizer(run, make_optimizer(run), params)
        rng, start, losses = np.random.default_rng(run["seed"]), 0, []

    print(f"data: {where}, {data.size:,} bytes")
    print(f"model: {config}; mesh: {mesh}; {sharding.strategy(mesh)} sharding")
    t = time.perf_counter()
    compiled, reference = compile_step(
        run, mesh, phases_for(args.phases, config), params, opt_state, pipeline
    )
    tokens_per_step = run["batch"] * run["seq"]
    ipu_rate = announce_compiled(compiled, mesh, t, tokens_per_step, "tokens", args.report)
    if start >= args.steps:
        print(f"the checkpoint is at step {start}, not before --steps {args.steps}: nothing to do")
        return 0

    throughput = Throughput(tokens_per_step, ipu_rate, unit="tok", noun="tokens")
    progress = Progress.of_flags(args, throughput, start, losses)
    status = loop(args, run, data, (compiled, reference), (params, opt_state, rng), progress)
    if status:
        return status
    if args.plot:
        axes = ",".join(f"{n}={s}" for n, s in zip(mesh.axis_names, mesh.axis_shapes, strict=True))
        title = (
            f"GPT: {config.layers} layers, d_model {config.d_model}, {config.heads} heads, "
            f"seq {config.seq}, batch {run['batch']}; mesh {axes} ({mesh.ipus} {mesh.target.name} "
            f"IPUs, ipujax)"
        )
        write_plot(args.plot, losses, title)
    print(f"wall time {time.perf_counter() - started:.1f} s")
    return 0


def loop(
    args: argparse.Namespace,
    run: dict[str, Any],
    data: np.ndarray,
    steps: tuple[ipujax.Compiled, Any],
    state: tuple[Any, Any, np.random.Generator],
    progress: Progress,
) -> int:
    """Steps to --steps of the compiled program (and of jax.jit with --check) on windows of
    `data`, checkpointed every --save-every steps: 0, or 1 when a check fails."""
    compiled, reference = steps
    params, opt_state, rng = state
    with progress:
        for step in range(progress.start + 1, args.steps + 1):
            tokens = sample_batch(data, rng, run["batch"], run["seq"])
            with fp16.numerics_key(run["numerics"], run["seed"], step):
                new_params, new_state, loss = progress.timed(compiled, params, opt_state, tokens)
            loss = float(loss)
            if args.check:
                problem = progress.compare(loss, float(reference(params, opt_state, tokens)[2]))
                if problem:
                    return progress.failed(step, problem)
            params, opt_state = new_params, new_state
            progress.done(step, loss)
            if args.checkpoint and (step % args.save_every == 0 or step == args.steps):
                save_checkpoint(args.checkpoint, params, opt_state, step, rng, run, progress.losses)
    print(progress.summary(first=progress.start))
    if args.check:
        print(progress.check_passed())
    return 0


if __name__ == "__main__":
    sys.exit(main())

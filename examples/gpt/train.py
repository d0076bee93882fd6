"""Trains the GPT of `model.py` on a virtual IPU system with ipujax, with optax AdamW.

    python examples/gpt/train.py --mesh dp=2,tp=2 --steps 200 --check --plot loss.png
    python examples/gpt/train.py --mesh dp=2,tp1=2,tp2=2 --report step.json
    python examples/gpt/train.py --checkpoint ckpt/ --steps 400 --resume
    python examples/gpt/train.py --mesh dp=2,pp=2 --pipeline --microbatches 4 --steps 20

The data is byte-level text (vocabulary 256): by default every `*.py` file of the Python
standard library, concatenated in sorted order, so any machine has it without a download.

Every step runs the compiled program on the simulated IPUs (`ipujax.jit`); `--check` runs it with
`jax.jit` too and fails when the losses differ beyond rounding. The progress bar shows the loss,
the simulator's tokens/s (wall clock on this CPU) and the simulated IPU system's tokens/s (tokens
per step / the cost report's seconds per step). `--pipeline` pipelines the step over the mesh's
`pp` axis with `ipujax.Pipeline`, one stage per IPU of the axis, the global batch cut into
`--microbatches` micro-batches (the values are jax.jit's: pipelining reorders work only).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import ipujax


def _sibling(name: str) -> ModuleType:
    """A module of this folder, loaded by path under a unique name: `tests/cli` has its own
    `workloads.py`, so these must not be imported through `sys.path`."""
    full = f"gpt_example_{name}"
    if full not in sys.modules:
        spec = importlib.util.spec_from_file_location(full, Path(__file__).with_name(f"{name}.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
    return sys.modules[full]


model = _sibling("model")
sharding = _sibling("sharding")
workloads = _sibling("workloads")

TARGETS = {"bow": ipujax.Target.bow, "mk2": ipujax.Target.mk2, "mk1": ipujax.Target.mk1}
CHECKPOINT_FILE = "checkpoint.npz"
CHECK_RTOL, CHECK_ATOL = 1e-5, 1e-6

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
}


class UsageError(Exception):
    """A bad flag or a checkpoint that does not match: one line on stderr, exit 2."""


def positive(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


# ---- flags ----------------------------------------------------------------------------------


def parse_mesh(text: str | None) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """'dp=2,tp=2' -> ((2, 2), ('dp', 'tp')); None -> one IPU on an axis named 'ipu'."""
    if not text:
        return (1,), ("ipu",)
    sizes, names = [], []
    for part in text.split(","):
        name, sep, size = part.strip().partition("=")
        if not sep or not name or not size.strip().isdigit() or int(size) < 1:
            raise UsageError(f"--mesh {text!r}: expected NAME=SIZE,... such as dp=2,tp=2")
        names.append(name.strip())
        sizes.append(int(size))
    return tuple(sizes), tuple(names)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="train.py", description="Train a small GPT on a virtual IPU system with ipujax."
    )
    add = parser.add_argument
    add("--target", choices=sorted(TARGETS), default="bow", help="IPU generation (default bow)")
    add("--tiles", type=positive, default=None, help="tiles per IPU (default: all of the target's)")
    add("--mesh", default=None, help="e.g. dp=2,tp=2 or dp=2,tp1=2,tp2=2 (default: 1 IPU)")
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
    add("--pipeline", action="store_true", help="pipeline the step over the mesh's pp axis")
    add("--microbatches", type=positive, default=2, help="micro-batches when pipelined (2)")
    add("--steps", type=positive, default=200, help="train until this step (default 200)")
    add("--lr", type=float, default=None, help=f"peak learning rate (default {RUN_FLAGS['lr']})")
    add("--warmup", type=int, default=None, help="linear warmup steps (default 20)")
    add("--weight-decay", type=float, default=None, help="AdamW weight decay (default 0.1)")
    add("--clip", type=float, default=None, help="global gradient-norm clip, 0 for none (1.0)")
    add("--seed", type=int, default=None, help="initialisation and data seed (default 0)")
    add("--data", default=None, help="a text file or a folder of *.py (default: the stdlib)")
    add("--check", action="store_true", help="also run every step with jax.jit and compare")
    add("--report", default=None, metavar="PATH.json", help="write the step's cost report")
    add("--plot", default=None, metavar="PATH.png", help="write the loss curve")
    add("--checkpoint", default=None, metavar="DIR", help="save a checkpoint here")
    add("--save-every", type=positive, default=100, help="checkpoint period in steps (default 100)")
    add("--resume", action="store_true", help="continue from the checkpoint in --checkpoint")
    add("--log-every", type=positive, default=10, help="print the loss every N steps (default 10)")
    add("--no-progress", action="store_true", help="no progress bar")
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


def _write_atomic(path: Path, write: Any, suffix: str) -> None:
    """Writes through `write(file)` to a temporary file beside `path`, then renames it over
    `path`: a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a plain file is what open() makes
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    _write_atomic(Path(folder) / CHECKPOINT_FILE, lambda f: np.savez(f, **arrays), ".npz")


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
        layers=run["layers"], d_model=run["d_model"], heads=run["heads"], seq=run["seq"]
    )


def load_checkpoint(folder: str) -> dict[str, Any]:
    """Everything `save_checkpoint` wrote, with params and optimizer state as pytrees."""
    run = read_run(folder)
    config = config_of(run)
    optimizer = make_optimizer(run)
    params_shape = jax.eval_shape(lambda: model.init(jax.random.key(0), config))
    state_shape = jax.eval_shape(lambda p: model.init_optimizer(optimizer, p), params_shape)
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
    return model.make_optimizer(
        lr=run["lr"], warmup=run["warmup"], weight_decay=run["weight_decay"], clip=run["clip"]
    )


def check_batch(run: dict[str, Any], mesh: ipujax.Mesh, microbatches: int = 1) -> None:
    """Each micro-batch (of the accumulation, or of the pipeline) splits evenly over the
    data-parallel replicas."""
    dp = dict(zip(mesh.axis_names, mesh.axis_shapes, strict=True)).get("dp", 1)
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
    if workloads.PIPELINE_AXIS not in mesh.axis_names:
        raise UsageError(f"--pipeline needs a mesh axis named {workloads.PIPELINE_AXIS}")
    return workloads.pipeline(args.microbatches)


def phases_for(flag: str, config: Any) -> Any:
    return {"none": None, "auto": "auto", "layer": model.layer_names(config)}[flag]


def make_mesh(args: argparse.Namespace) -> ipujax.Mesh:
    target = TARGETS[args.target]()
    if args.tiles is not None:
        target = target.with_tiles(args.tiles)
    sizes, names = parse_mesh(args.mesh)
    return ipujax.make_mesh(sizes, names, target=target)


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
        step = model.make_train_step(make_optimizer(run), micro_batches=run["grad_accumulation"])
        tokens = jax.ShapeDtypeStruct((run["batch"], run["seq"] + 1), jnp.int32)
        specs = sharding.train_specs(params, opt_state, mesh)
        jitted = ipujax.jit(step, mesh=mesh, in_shardings=specs, phases=phases, pipeline=pipeline)
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
    _write_atomic(Path(path), lambda f: fig.savefig(f, format="png"), ".png")
    plt.close(fig)


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


def fail(message: str) -> int:
    print(f"train.py: error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return train(args)
    except UsageError as error:
        return fail(str(error))
    except (ipujax.ConfigError, ipujax.ShardingError, ipujax.OutOfMemoryError) as error:
        return fail(f"{type(error).__name__}: {' '.join(str(error).split())}")


def train(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    if args.resume and not args.checkpoint:
        raise UsageError("--resume needs --checkpoint DIR")
    resumed = load_checkpoint(args.checkpoint) if args.resume else None
    run = settings(args, resumed["run"] if resumed else None)
    config = config_of(run)
    mesh = make_mesh(args)
    try:
        sharding.check_divisible(mesh, config.heads)
        sharding.strategy(mesh)
    except ValueError as error:
        raise UsageError(f"--mesh {args.mesh}: {error}") from None
    pipeline = pipeline_for(args, mesh)
    if pipeline is not None and run["grad_accumulation"] > 1:
        raise UsageError("--pipeline accumulates over its --microbatches; drop --grad-accumulation")
    check_batch(run, mesh, pipeline.microbatches if pipeline else 1)
    data, where = load_corpus(run["data"])

    if resumed:
        params, opt_state, rng = resumed["params"], resumed["opt_state"], resumed["rng"]
        start, losses = resumed["step"], resumed["losses"]
    else:
        params = model.init(jax.random.key(run["seed"]), config)
        opt_state = model.init_optimizer(make_optimizer(run), params)
        rng, start, losses = np.random.default_rng(run["seed"]), 0, []

    print(f"data: {where}, {data.size:,} bytes")
    print(f"model: {config}; mesh: {mesh}; {sharding.strategy(mesh)} sharding")
    t = time.perf_counter()
    compiled, reference = compile_step(
        run, mesh, phases_for(args.phases, config), params, opt_state, pipeline
    )
    report = compiled.cost_report()
    tokens_per_step = run["batch"] * run["seq"]
    ipu_rate = tokens_per_step / report.seconds
    print(
        f"compiled in {time.perf_counter() - t:.1f} s: {report.total_cycles:,} cycles per step "
        f"= {report.seconds * 1e3:.3f} ms on {mesh.ipus} {mesh.target.name} IPU(s), "
        f"{ipu_rate:,.0f} tokens/s simulated, fits: {report.fits}"
    )
    if args.report:
        _write_atomic(Path(args.report), lambda f: f.write(report.to_json().encode()), ".json")
    if start >= args.steps:
        print(f"the checkpoint is at step {start}, not before --steps {args.steps}: nothing to do")
        return 0

    status = loop(args, run, data, compiled, reference, params, opt_state, rng, start, losses)
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
    compiled: ipujax.Compiled,
    reference: Any,
    params: Any,
    opt_state: Any,
    rng: np.random.Generator,
    start: int,
    losses: list[float],
) -> int:
    from tqdm import tqdm

    tokens_per_step = run["batch"] * run["seq"]
    ipu_rate = tokens_per_step / compiled.cost_report().seconds
    meter, worst = Meter(), 0.0
    bar = tqdm(total=args.steps, initial=start, disable=args.no_progress, unit="step")
    with bar:
        for step in range(start + 1, args.steps + 1):
            tokens = sample_batch(data, rng, run["batch"], run["seq"])
            t = time.perf_counter()
            new_params, new_state, loss = jax.block_until_ready(compiled(params, opt_state, tokens))
            meter.add(time.perf_counter() - t)
            loss = float(loss)
            if args.check:
                want = float(reference(params, opt_state, tokens)[2])
                worst = max(worst, abs(loss - want))
                if not np.isclose(loss, want, rtol=CHECK_RTOL, atol=CHECK_ATOL):
                    bar.close()
                    print(
                        f"check failed at step {step}: ipujax loss {loss!r}, jax.jit loss "
                        f"{want!r} (rtol {CHECK_RTOL}, atol {CHECK_ATOL})",
                        file=sys.stderr,
                    )
                    return 1
            params, opt_state = new_params, new_state
            losses.append(loss)
            sim_rate = tokens_per_step / meter.times[-1]
            postfix = f"loss {loss:.4f} sim {sim_rate:,.0f} tok/s ipu {ipu_rate:,.0f} tok/s"
            bar.set_postfix_str(postfix, refresh=False)
            bar.update()
            if step == start + 1 or step % args.log_every == 0 or step == args.steps:
                tqdm.write(f"step {step} loss {loss:.4f}")
            if args.checkpoint and (step % args.save_every == 0 or step == args.steps):
                save_checkpoint(args.checkpoint, params, opt_state, step, rng, run, losses)
    tail = losses[start:][-10:]
    print(
        f"steps {start}->{args.steps}: loss {losses[start]:.4f} -> {losses[-1]:.4f} "
        f"(mean of the last {len(tail)}: {np.mean(tail):.4f}); "
        f"simulator {tokens_per_step / meter.seconds:,.0f} "
        f"tokens/s ({meter.seconds * 1e3:.1f} ms per step), simulated IPUs {ipu_rate:,.0f} tokens/s"
    )
    if args.check:
        print(f"check passed: {args.steps - start} steps, max |loss - jax.jit loss| {worst:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Trains the small ResNet of `model.py` data parallel on a virtual IPU system with ipujax.

    python examples/resnet/train.py --mesh dp=4 --steps 100 --check --report step.json
    python examples/resnet/train.py --mesh dp=1 --optimizer lars --steps 50

The data is synthetic and CIFAR-sized (32x32x3, 10 classes), made on the fly: each class has a
fixed coarse random pattern, and an image is its class's pattern plus Gaussian noise, so the loss
can fall without a download. Images and labels are split over the mesh's `dp` axis; parameters,
batch norm statistics and the optimizer's state are replicated (`sharding.py`).

Every step runs the compiled program on the simulated IPUs (`ipujax.jit`); `--check` runs it with
`jax.jit` too and fails when the loss, parameters or batch norm statistics differ beyond
rounding (`check_step` says how far that is). The progress bar shows the loss, the simulator's
images/s (wall clock on this CPU) and the simulated IPU system's images/s (images per step / the
cost report's seconds per step).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
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
    `workloads.py` and examples/gpt its own `model.py`, so these must not go through `sys.path`."""
    full = f"resnet_example_{name}"
    if full not in sys.modules:
        spec = importlib.util.spec_from_file_location(full, Path(__file__).with_name(f"{name}.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
    return sys.modules[full]


model = _sibling("model")
sharding = _sibling("sharding")

TARGETS = {"bow": ipujax.Target.bow, "mk2": ipujax.Target.mk2, "mk1": ipujax.Target.mk1}
CHECK_RTOL, CHECK_ATOL = 1e-5, 1e-6  # the loss, elementwise
STATE_RTOL, STATE_ATOL = 5e-2, 1e-6  # a param or statistic, in norm, against its change
NOISE = 1.0  # the noise's standard deviation; the class patterns' is 1
PATTERN_CELLS = 4  # each class pattern is 4x4 cells of random colour, upsampled to the image


class UsageError(Exception):
    """A bad flag: one line on stderr, exit 2."""


def positive(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


# ---- flags ----------------------------------------------------------------------------------


def parse_mesh(text: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """'dp=4' -> ((4,), ('dp',))."""
    sizes, names = [], []
    for part in text.split(","):
        name, sep, size = part.strip().partition("=")
        if not sep or not name or not size.strip().isdigit() or int(size) < 1:
            raise UsageError(f"--mesh {text!r}: expected NAME=SIZE such as dp=4")
        names.append(name.strip())
        sizes.append(int(size))
    return tuple(sizes), tuple(names)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="train.py",
        description="Train a small ResNet data parallel on a virtual IPU system with ipujax.",
    )
    add = parser.add_argument
    add("--target", choices=sorted(TARGETS), default="mk2", help="IPU generation (default mk2)")
    add("--tiles", type=positive, default=None, help="tiles per IPU (default: all of the target's)")
    add("--mesh", default="dp=4", help="data-parallel replicas, e.g. dp=4 (the default) or dp=1")
    add("--steps", type=positive, default=100, help="training steps (default 100)")
    add("--batch", type=positive, default=32, help="global batch (default 32)")
    add("--optimizer", choices=model.OPTIMIZERS, default="sgd", help="default sgd (momentum)")
    add("--lr", type=float, default=None, help=f"learning rate (default {model.DEFAULT_LR})")
    add("--weight-decay", type=float, default=1e-4, help="on kernels only (default 1e-4)")
    add("--seed", type=int, default=0, help="initialisation and data seed (default 0)")
    add("--check", action="store_true", help="also run every step with jax.jit and compare")
    add("--report", default=None, metavar="PATH.json", help="write the step's cost report")
    add("--log-every", type=positive, default=10, help="print the loss every N steps (default 10)")
    add("--no-progress", action="store_true", help="no progress bar")
    return parser


# ---- data -----------------------------------------------------------------------------------


def class_patterns(config: Any, seed: int) -> np.ndarray:
    """One fixed pattern per class [classes, H, W, C]: PATTERN_CELLS x PATTERN_CELLS cells of
    standard-normal colour, each cell a block of pixels."""
    rng = np.random.default_rng(seed)
    cells = rng.standard_normal(
        (config.num_classes, PATTERN_CELLS, PATTERN_CELLS, config.channels), np.float32
    )
    scale = -(-config.image_size // PATTERN_CELLS)
    big = np.repeat(np.repeat(cells, scale, axis=1), scale, axis=2)
    return big[:, : config.image_size, : config.image_size]


def sample_batch(
    patterns: np.ndarray, rng: np.random.Generator, batch: int
) -> tuple[np.ndarray, np.ndarray]:
    """`batch` images (their class's pattern plus noise, float32 NHWC) and int32 labels."""
    labels = rng.integers(0, patterns.shape[0], size=batch).astype(np.int32)
    noise = rng.standard_normal((batch, *patterns.shape[1:]), np.float32)
    return patterns[labels] + NOISE * noise, labels


# ---- training -------------------------------------------------------------------------------


def make_mesh(args: argparse.Namespace) -> ipujax.Mesh:
    target = TARGETS[args.target]()
    if args.tiles is not None:
        target = target.with_tiles(args.tiles)
    sizes, names = parse_mesh(args.mesh)
    mesh = ipujax.make_mesh(sizes, names, target=target)
    try:
        sharding.check_mesh(mesh)
    except ValueError as error:
        raise UsageError(f"--mesh {args.mesh}: {error}") from None
    return mesh


def check_batch(batch: int, mesh: ipujax.Mesh) -> None:
    """The batch splits evenly over the data-parallel replicas."""
    dp = sharding.dp_size(mesh)
    if batch % dp:
        raise UsageError(f"--batch {batch} does not split over dp={dp}; use a multiple of {dp}")


_COMPILED: dict[Any, Any] = {}  # compiled steps, reused by runs in one process (tests)


def compile_step(
    args: argparse.Namespace, config: Any, mesh: ipujax.Mesh, state: tuple[Any, Any, Any]
) -> tuple[ipujax.Compiled, Any]:
    """The training step compiled for the mesh, and the same step under jax.jit."""
    key = (config, mesh, args.batch, args.optimizer, args.lr, args.weight_decay)
    if key not in _COMPILED:
        optimizer = model.make_optimizer(args.optimizer, args.lr, args.weight_decay)
        step = model.make_train_step(optimizer, config)
        size, channels = config.image_size, config.channels
        images = jax.ShapeDtypeStruct((args.batch, size, size, channels), jnp.float32)
        labels = jax.ShapeDtypeStruct((args.batch,), jnp.int32)
        jitted = ipujax.jit(step, mesh=mesh, in_shardings=sharding.train_specs(mesh))
        _COMPILED[key] = (jitted.lower(*state, images, labels).compile(), jax.jit(step))
    return _COMPILED[key]


# ---- --check ----------------------------------------------------------------------------------


def _flat(trees: Any) -> dict[str, np.ndarray]:
    """The leaves of (params, bn_state) in float64, by their path."""
    named = zip(("params", "bn_state"), trees, strict=True)
    return {
        name + jax.tree_util.keystr(path): np.asarray(leaf, np.float64)
        for name, tree in named
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def drift(before: Any, got: Any, want: Any) -> dict[str, tuple[float, float]]:
    """For every leaf of the parameters and batch norm statistics: |ipujax's new value -
    jax.jit's| and |jax.jit's change in the step| (norms over the leaf)."""
    old, new, ref = _flat(before), _flat(got), _flat(want)
    return {
        name: (float(np.linalg.norm(new[name] - value)), float(np.linalg.norm(value - old[name])))
        for name, value in ref.items()
    }


def check_step(state: Any, got: Any, want: Any) -> tuple[str | None, float]:
    """Why ipujax's step differs from jax.jit's beyond rounding (or None), and the largest
    drift of a parameter or batch norm statistic relative to its change in the step.

    The loss must agree to CHECK_RTOL elementwise. Each leaf of the new parameters and running
    statistics must agree in norm to STATE_RTOL of its change in the step. That is loose on
    purpose: float32 rounding differs between the programs (on many IPUs the batch statistics
    and gradients are summed in another order), and where a ReLU's input is within rounding of
    zero either program may pass the gradient; each way is as right as the other (a float64 step
    sides with ipujax as often as with jax.jit), but the flipped gate moves the gradients behind
    it by up to about 1e-2 at tiny batches. Most steps drift by some 1e-5; a real error (a
    missing AllReduce, per-replica batch statistics, a gradient off by the dp factor) by tens of
    percent. The optimizer's state is not compared itself: its new value drives this step's
    update, and the change of a slow average (Adam's second moment) is a cancellation."""
    loss, reference = float(got[3]), float(want[3])
    if not np.isclose(loss, reference, rtol=CHECK_RTOL, atol=CHECK_ATOL):
        message = f"ipujax loss {loss!r}, jax.jit loss {reference!r}"
        return f"{message} (rtol {CHECK_RTOL}, atol {CHECK_ATOL})", float("inf")
    worst = 0.0
    for name, (error, change) in drift(state[:2], got[:2], want[:2]).items():
        if error > STATE_RTOL * change + STATE_ATOL:
            return (
                f"{name} differs from jax.jit's by {error:.3g} (norm) after a step that changed "
                f"it by {change:.3g} (rtol {STATE_RTOL}, atol {STATE_ATOL})"
            ), float("inf")
        if change:
            worst = max(worst, error / change)
    return None, worst


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
    config = model.small_config()
    mesh = make_mesh(args)
    check_batch(args.batch, mesh)
    params, bn_state = model.init(config, jax.random.key(args.seed))
    optimizer = model.make_optimizer(args.optimizer, args.lr, args.weight_decay)
    state = (params, bn_state, model.init_optimizer(optimizer, params))

    print(f"model: {config}")
    print(f"mesh: {mesh}; optimizer: {args.optimizer}; global batch {args.batch}")
    t = time.perf_counter()
    compiled, reference = compile_step(args, config, mesh, state)
    report = compiled.cost_report()
    ipu_rate = args.batch / report.seconds
    print(
        f"compiled in {time.perf_counter() - t:.1f} s: {report.total_cycles:,} cycles per step "
        f"= {report.seconds * 1e3:.3f} ms on {mesh.ipus} {mesh.target.name} IPU(s), "
        f"{ipu_rate:,.0f} images/s simulated, fits: {report.fits}"
    )
    if args.report:
        path = Path(args.report)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(report.to_json())
    patterns = class_patterns(config, args.seed)
    status = loop(args, (compiled, reference), state, patterns, ipu_rate)
    print(f"wall time {time.perf_counter() - started:.1f} s")
    return status


def loop(
    args: argparse.Namespace,
    steps: tuple[ipujax.Compiled, Any],
    state: tuple[Any, Any, Any],
    patterns: np.ndarray,
    ipu_rate: float,
) -> int:
    from tqdm import tqdm

    compiled, reference = steps
    rng = np.random.default_rng(args.seed + 1)
    meter, losses, worst, drifted = Meter(), [], 0.0, 0.0
    bar = tqdm(total=args.steps, disable=args.no_progress, unit="step")
    with bar:
        for step in range(1, args.steps + 1):
            images, labels = sample_batch(patterns, rng, args.batch)
            t = time.perf_counter()
            out = jax.block_until_ready(compiled(*state, images, labels))
            meter.add(time.perf_counter() - t)
            if args.check:
                want = reference(*state, images, labels)
                problem, relative = check_step(state, out, want)
                if problem:
                    bar.close()
                    print(f"check failed at step {step}: {problem}", file=sys.stderr)
                    return 1
                worst = max(worst, abs(float(out[3]) - float(want[3])))
                drifted = max(drifted, relative)
            state, loss = out[:3], float(out[3])
            losses.append(loss)
            postfix = (
                f"loss {loss:.4f} sim {args.batch / meter.times[-1]:,.0f} img/s "
                f"ipu {ipu_rate:,.0f} img/s"
            )
            bar.set_postfix_str(postfix, refresh=False)
            bar.update()
            if step == 1 or step % args.log_every == 0 or step == args.steps:
                tqdm.write(f"step {step} loss {loss:.4f}")
    tail = losses[-10:]
    print(
        f"steps 1->{args.steps}: loss {losses[0]:.4f} -> {losses[-1]:.4f} "
        f"(mean of the last {len(tail)}: {np.mean(tail):.4f}); "
        f"simulator {args.batch / meter.seconds:,.1f} images/s "
        f"({meter.seconds * 1e3:.1f} ms per step), simulated IPUs {ipu_rate:,.0f} images/s"
    )
    if args.check:
        print(
            f"check passed: {args.steps} steps, max |loss - jax.jit loss| {worst:.3g}, "
            f"largest state drift {drifted:.3g} of a step's change"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
import sys
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
from shared.flags import UsageError, positive
from shared.progress import Progress, Throughput, announce_compiled, loss_mismatch

model = load.example("resnet", "model")
sharding = load.example("resnet", "sharding")

STATE_RTOL, STATE_ATOL = 5e-2, 1e-6  # a param or statistic, in norm, against its change
NOISE = 1.0  # the noise's standard deviation; the class patterns' is 1
PATTERN_CELLS = 4  # each class pattern is 4x4 cells of random colour, upsampled to the image


# ---- flags ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = flags.parser(
        "Train a small ResNet data parallel on a virtual IPU system with ipujax.",
        mesh_help="data-parallel replicas, e.g. dp=4 (the default) or dp=1",
        target="mk2",
        mesh="dp=4",
    )
    add = parser.add_argument
    add("--steps", type=positive, default=100, help="training steps (default 100)")
    add("--batch", type=positive, default=32, help="global batch (default 32)")
    add("--optimizer", choices=model.OPTIMIZERS, default="sgd", help="default sgd (momentum)")
    add("--lr", type=float, default=None, help=f"learning rate (default {model.DEFAULT_LR})")
    add("--weight-decay", type=float, default=1e-4, help="on kernels only (default 1e-4)")
    add("--seed", type=int, default=0, help="initialisation and data seed (default 0)")
    flags.add_check(parser)
    flags.add_logging(parser)
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
    mesh = meshes.make_mesh(args, args.mesh, "NAME=SIZE such as dp=4")
    with meshes.mesh_errors(args.mesh):
        sharding.check_mesh(mesh)
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

    The loss must agree within rounding (`loss_mismatch`). Each leaf of the new parameters and
    running statistics must agree in norm to STATE_RTOL of its change in the step. That is loose on
    purpose: float32 rounding differs between the programs (on many IPUs the batch statistics
    and gradients are summed in another order), and where a ReLU's input is within rounding of
    zero either program may pass the gradient; each way is as right as the other (a float64 step
    sides with ipujax as often as with jax.jit), but the flipped gate moves the gradients behind
    it by up to about 1e-2 at tiny batches. Most steps drift by some 1e-5; a real error (a
    missing AllReduce, per-replica batch statistics, a gradient off by the dp factor) by tens of
    percent. The optimizer's state is not compared itself: its new value drives this step's
    update, and the change of a slow average (Adam's second moment) is a cancellation."""
    problem = loss_mismatch(float(got[3]), float(want[3]))
    if problem:
        return problem, float("inf")
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


def main(argv: Sequence[str] | None = None) -> int:
    return flags.run(train, build_parser(), argv)


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
    ipu_rate = announce_compiled(compiled, mesh, t, args.batch, "images", args.report)
    throughput = Throughput(args.batch, ipu_rate, unit="img", noun="images", digits=1)
    patterns = class_patterns(config, args.seed)
    status = loop(args, (compiled, reference), state, patterns, Progress.of_flags(args, throughput))
    print(f"wall time {time.perf_counter() - started:.1f} s")
    return status


def loop(
    args: argparse.Namespace,
    steps: tuple[ipujax.Compiled, Any],
    state: tuple[Any, Any, Any],
    patterns: np.ndarray,
    progress: Progress,
) -> int:
    """--steps steps of the compiled program (and of jax.jit with --check) on fresh batches of
    the class patterns: 0, or 1 when a check fails."""
    compiled, reference = steps
    rng, drifted = np.random.default_rng(args.seed + 1), 0.0
    with progress:
        for step in range(1, args.steps + 1):
            images, labels = sample_batch(patterns, rng, args.batch)
            out = progress.timed(compiled, *state, images, labels)
            if args.check:
                want = reference(*state, images, labels)
                problem, relative = check_step(state, out, want)
                if problem:
                    return progress.failed(step, problem)
                progress.compare(float(out[3]), float(want[3]))
                drifted = max(drifted, relative)
            state = out[:3]
            progress.done(step, float(out[3]))
    print(progress.summary(first=1))
    if args.check:
        print(f"{progress.check_passed()}, largest state drift {drifted:.3g} of a step's change")
    return 0


if __name__ == "__main__":
    sys.exit(main())

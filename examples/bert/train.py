"""Trains the tiny BERT of `workloads.py` (MLM loss, LAMB) on a virtual IPU system with ipujax.

    python examples/bert/train.py --mesh dp=2,tp=2 --steps 50 --check --report step.json
    python examples/bert/train.py --mesh dp=2,pp=2 --pipeline --microbatches 4 --steps 20

The data is synthetic (`workloads.random_batch`): random tokens, random masked positions and as
labels the tokens at those positions, made on the fly, so nothing is downloaded. The inputs are
not masked, so the loss can fall: the model learns to read each position's own token.

Every step runs the compiled program on the simulated IPUs (`ipujax.jit`), its shardings from
the mesh's axis names (`sharding.py`: dp splits the batch, tp the heads and MLP, any other axis
nothing). `--pipeline` pipelines the step over the mesh's `pp` axis with `ipujax.Pipeline`, the
global batch cut into `--microbatches` micro-batches. `--check` runs every step with `jax.jit`
too and fails when the losses differ beyond rounding.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import numpy as np

import ipujax


def _sibling(name: str) -> ModuleType:
    """A module of this folder, loaded by path under a unique name: `tests/cli` has its own
    `workloads.py` and examples/gpt its own `model.py`, so these must not go through `sys.path`."""
    full = f"bert_example_{name}"
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
CHECK_RTOL, CHECK_ATOL = 1e-5, 1e-6


class UsageError(Exception):
    """A bad flag: one line on stderr, exit 2."""


def positive(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def parse_mesh(text: str | None) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """'dp=2,pp=2' -> ((2, 2), ('dp', 'pp')); None -> one IPU on an axis named 'ipu'."""
    if not text:
        return (1,), ("ipu",)
    sizes, names = [], []
    for part in text.split(","):
        name, sep, size = part.strip().partition("=")
        if not sep or not name or not size.strip().isdigit() or int(size) < 1:
            raise UsageError(f"--mesh {text!r}: expected NAME=SIZE,... such as dp=2,pp=2")
        names.append(name.strip())
        sizes.append(int(size))
    return tuple(sizes), tuple(names)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="train.py", description="Train a tiny BERT on a virtual IPU system with ipujax."
    )
    add = parser.add_argument
    add("--target", choices=sorted(TARGETS), default="bow", help="IPU generation (default bow)")
    add("--tiles", type=positive, default=None, help="tiles per IPU (default: all of the target's)")
    add("--mesh", default=None, help="e.g. dp=2,tp=2 or dp=2,pp=2 (default: 1 IPU)")
    add("--layers", type=positive, default=workloads.TINY.layers, help="encoder blocks (2)")
    add("--batch", type=positive, default=8, help="global batch in sequences (default 8)")
    add("--pipeline", action="store_true", help="pipeline the step over the mesh's pp axis")
    add("--microbatches", type=positive, default=2, help="micro-batches when pipelined (2)")
    add("--steps", type=positive, default=50, help="training steps (default 50)")
    add("--lr", type=float, default=2e-2, help="peak learning rate (default 2e-2)")
    add("--seed", type=int, default=0, help="initialisation and data seed (default 0)")
    add("--check", action="store_true", help="also run every step with jax.jit and compare")
    add("--report", default=None, metavar="PATH.json", help="write the step's cost report")
    add("--log-every", type=positive, default=10, help="print the loss every N steps (default 10)")
    return parser


def make_mesh(args: argparse.Namespace, heads: int) -> ipujax.Mesh:
    target = TARGETS[args.target]()
    if args.tiles is not None:
        target = target.with_tiles(args.tiles)
    sizes, names = parse_mesh(args.mesh)
    mesh = ipujax.make_mesh(sizes, names, target=target)
    try:
        sharding.check_divisible(mesh, heads)
    except ValueError as error:
        raise UsageError(f"--mesh {args.mesh}: {error}") from None
    if args.pipeline and workloads.PIPELINE_AXIS not in names:
        raise UsageError(f"--pipeline needs a mesh axis named {workloads.PIPELINE_AXIS}")
    return mesh


def check_batch(args: argparse.Namespace, mesh: ipujax.Mesh) -> None:
    """Each micro-batch splits evenly over the data-parallel replicas."""
    dp = dict(zip(mesh.axis_names, mesh.axis_shapes, strict=True)).get("dp", 1)
    parts = dp * (args.microbatches if args.pipeline else 1)
    if args.batch % parts:
        raise UsageError(f"--batch {args.batch} does not split into {parts} parts (dp x micro)")


def jit_kwargs(args: argparse.Namespace, mesh: ipujax.Mesh, params: Any, state: Any) -> dict:
    kwargs: dict[str, Any] = {
        "mesh": mesh,
        "in_shardings": sharding.train_specs(params, state, mesh),
    }
    if args.pipeline:
        kwargs["pipeline"] = ipujax.Pipeline(
            axis=workloads.PIPELINE_AXIS, microbatches=args.microbatches, recompute=True
        )
    return kwargs


def compile_step(
    args: argparse.Namespace, mesh: ipujax.Mesh, step: Any, params: Any, opt_state: Any, batch: Any
) -> tuple[ipujax.Compiled, Any]:
    """The training step compiled for the mesh (`batch` may be shapes), and it under jax.jit."""
    jitted = ipujax.jit(step, **jit_kwargs(args, mesh, params, opt_state))
    return jitted.lower(params, opt_state, batch).compile(), jax.jit(step)


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
    config = dataclasses.replace(workloads.TINY, layers=args.layers)
    mesh = make_mesh(args, config.heads)
    check_batch(args, mesh)
    optimizer = model.make_optimizer(lr=args.lr)
    params = model.init(jax.random.key(args.seed), config)
    opt_state = optimizer.init(params)
    step = model.make_train_step(optimizer)
    print(f"model: {config}; mesh: {mesh}; global batch {args.batch}")

    t = time.perf_counter()
    batch_shapes = workloads.batch_shapes(config, args.batch)
    compiled, reference = compile_step(args, mesh, step, params, opt_state, batch_shapes)
    report = compiled.cost_report()
    print(
        f"compiled in {time.perf_counter() - t:.1f} s: {report.total_cycles:,} cycles per step "
        f"= {report.seconds * 1e3:.3f} ms on {mesh.ipus} {mesh.target.name} IPU(s), "
        f"{args.batch / report.seconds:,.0f} sequences/s simulated, fits: {report.fits}"
    )
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(report.to_json())
    return loop(args, config, (compiled, reference), params, opt_state)


def loop(
    args: argparse.Namespace, config: Any, steps: tuple[Any, Any], params: Any, opt_state: Any
) -> int:
    """`args.steps` steps of the compiled program on fresh random batches, each checked against
    jax.jit's loss with `--check`: 0, or 1 when a check fails."""
    compiled, reference = steps
    rng, losses, worst = np.random.default_rng(args.seed), [], 0.0
    for i in range(1, args.steps + 1):
        batch = workloads.random_batch(config, args.batch, rng)
        new_params, new_state, loss = compiled(params, opt_state, batch)
        if args.check:
            want = float(reference(params, opt_state, batch)[2])
            worst = max(worst, abs(float(loss) - want))
            if not np.isclose(float(loss), want, rtol=CHECK_RTOL, atol=CHECK_ATOL):
                print(
                    f"check failed at step {i}: ipujax loss {float(loss)!r}, jax.jit loss "
                    f"{want!r} (rtol {CHECK_RTOL}, atol {CHECK_ATOL})",
                    file=sys.stderr,
                )
                return 1
        params, opt_state = new_params, new_state
        losses.append(float(loss))
        if i == 1 or i % args.log_every == 0 or i == args.steps:
            print(f"step {i} loss {losses[-1]:.4f}")
    print(f"steps 1->{args.steps}: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    if args.check:
        print(f"check passed: {args.steps} steps, max |loss - jax.jit loss| {worst:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

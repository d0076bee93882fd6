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
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

import ipujax

if (EXAMPLES := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, EXAMPLES)  # examples/, for `shared`: see shared/__init__.py
from shared import flags, load, meshes
from shared.flags import UsageError, positive
from shared.progress import Progress, announce_compiled

model = load.example("bert", "model")
sharding = load.example("bert", "sharding")
workloads = load.example("bert", "workloads")


def build_parser() -> argparse.ArgumentParser:
    parser = flags.parser(
        "Train a tiny BERT on a virtual IPU system with ipujax.",
        mesh_help="e.g. dp=2,tp=2 or dp=2,pp=2 (default: 1 IPU)",
    )
    add = parser.add_argument
    add("--layers", type=positive, default=workloads.TINY.layers, help="encoder blocks (2)")
    add("--batch", type=positive, default=8, help="global batch in sequences (default 8)")
    flags.add_pipeline(parser)
    add("--steps", type=positive, default=50, help="training steps (default 50)")
    add("--lr", type=float, default=2e-2, help="peak learning rate (default 2e-2)")
    add("--seed", type=int, default=0, help="initialisation and data seed (default 0)")
    flags.add_check(parser)
    flags.add_logging(parser, progress_bar=False)
    return parser


def make_mesh(args: argparse.Namespace, heads: int) -> ipujax.Mesh:
    mesh = meshes.make_mesh(args, args.mesh or meshes.ONE_IPU, "NAME=SIZE,... such as dp=2,pp=2")
    with meshes.mesh_errors(args.mesh):
        sharding.check_divisible(mesh, heads)
    if args.pipeline:
        meshes.require_pipeline_axis(mesh)
    return mesh


def check_batch(args: argparse.Namespace, mesh: ipujax.Mesh) -> None:
    """Each micro-batch splits evenly over the data-parallel replicas."""
    dp = meshes.axis_size(mesh, "dp")
    parts = dp * (args.microbatches if args.pipeline else 1)
    if args.batch % parts:
        raise UsageError(f"--batch {args.batch} does not split into {parts} parts (dp x micro)")


def jit_kwargs(args: argparse.Namespace, mesh: ipujax.Mesh, params: Any, state: Any) -> dict:
    kwargs: dict[str, Any] = {
        "mesh": mesh,
        "in_shardings": sharding.train_specs(params, state, mesh),
    }
    if args.pipeline:
        kwargs["pipeline"] = meshes.pipeline(args.microbatches)
    return kwargs


def compile_step(
    args: argparse.Namespace, mesh: ipujax.Mesh, step: Any, params: Any, opt_state: Any, batch: Any
) -> tuple[ipujax.Compiled, Any]:
    """The training step compiled for the mesh (`batch` may be shapes), and it under jax.jit."""
    jitted = ipujax.jit(step, **jit_kwargs(args, mesh, params, opt_state))
    return jitted.lower(params, opt_state, batch).compile(), jax.jit(step)


def main(argv: Sequence[str] | None = None) -> int:
    return flags.run(train, build_parser(), argv)


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
    announce_compiled(compiled, mesh, t, args.batch, "sequences", args.report)
    return loop(args, config, (compiled, reference), params, opt_state)


def loop(
    args: argparse.Namespace, config: Any, steps: tuple[Any, Any], params: Any, opt_state: Any
) -> int:
    """`args.steps` steps of the compiled program on fresh random batches, each checked against
    jax.jit's loss with `--check`: 0, or 1 when a check fails."""
    compiled, reference = steps
    rng, progress = np.random.default_rng(args.seed), Progress.of_flags(args)
    with progress:
        for i in range(1, args.steps + 1):
            batch = workloads.random_batch(config, args.batch, rng)
            new_params, new_state, loss = progress.timed(compiled, params, opt_state, batch)
            if args.check:
                problem = progress.compare(
                    float(loss), float(reference(params, opt_state, batch)[2])
                )
                if problem:
                    return progress.failed(i, problem)
            params, opt_state = new_params, new_state
            progress.done(i, float(loss))
    print(progress.summary(first=1))
    if args.check:
        print(progress.check_passed())
    return 0


if __name__ == "__main__":
    sys.exit(main())

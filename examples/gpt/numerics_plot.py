"""Trains the GPT in pure float16 twice on the same data, with round to nearest
(`numerics="exact"`, jax.jit's numbers) and with the IPU's stochastic rounding
(`numerics="ipu"`), and plots both loss curves:

    python examples/gpt/numerics_plot.py --steps 300 --lr 2e-4 --plot docs/gpt_fp16_numerics.png

At a small learning rate most float16 weights' updates are below half their float16 spacing:
round to nearest drops them, stochastic rounding keeps them in expectation (`fp16.py`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np

if (EXAMPLES := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, EXAMPLES)  # examples/, for `shared`: see shared/__init__.py
from shared import load
from shared.files import write_atomic

train = load.example("gpt", "train")
fp16 = load.example("gpt", "fp16")

NUMERICS = {"exact": "round to nearest (numerics='exact')", "ipu": "stochastic (numerics='ipu')"}


def losses(numerics: str, steps: int, lr: float, seed: int) -> list[float]:
    """The per-step losses of a pure-float16 run of the default GPT on one IPU, its batches
    drawn from `seed` (the same for every numerics)."""
    run = {**train.MODEL_FLAGS, **train.RUN_FLAGS, "fp16": True, "lr": lr, "seed": seed}
    run["numerics"] = numerics
    config = train.config_of(run)
    params = train.model.init(jax.random.key(seed), config)
    opt_state = train.init_optimizer(run, train.make_optimizer(run), params)
    mesh = train.meshes.make_mesh(
        argparse.Namespace(target="bow", tiles=None), train.meshes.ONE_IPU, ""
    )
    compiled, _ = train.compile_step(run, mesh, None, params, opt_state)
    data, _ = train.load_corpus(None)
    rng, out = np.random.default_rng(seed), []
    for step in range(1, steps + 1):
        tokens = train.sample_batch(data, rng, run["batch"], run["seq"])
        with fp16.numerics_key(numerics, seed, step):
            params, opt_state, loss = compiled(params, opt_state, tokens)
        out.append(float(loss))
    return out


def plot(path: str, curves: dict[str, list[float]], lr: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4), dpi=80)
    for numerics, values in curves.items():
        window = min(20, len(values))
        smooth = np.convolve(values, np.ones(window) / window, mode="valid")
        ax.plot(np.arange(window, len(values) + 1), smooth, lw=1.8, label=NUMERICS[numerics])
    ax.set_xlabel("step")
    ax.set_ylabel("loss, mean of 20 steps")
    ax.set_title(f"GPT in pure float16 (weights, momentum, updates), SGD lr {lr:g}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    write_atomic(Path(path), lambda f: fig.savefig(f, format="png"), ".png")
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default="gpt_fp16_numerics.png", metavar="PATH.png")
    args = parser.parse_args(argv)
    curves = {n: losses(n, args.steps, args.lr, args.seed) for n in NUMERICS}
    for numerics, values in curves.items():
        print(f"{numerics:>5}: loss of the last 20 steps {np.mean(values[-20:]):.4f}")
    plot(args.plot, curves, args.lr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

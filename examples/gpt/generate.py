"""Samples text from a checkpoint of `train.py`.

    python examples/gpt/generate.py --checkpoint ckpt/ --prompt "def " --temperature 0.8

Each new byte is one forward pass over the last `seq` bytes (a fixed [1, seq] window, so the
program is compiled once): on one virtual IPU through `ipujax.jit`, or with `--jax` through
`jax.jit`. The next byte is drawn from the softmax of the logits / temperature (greedy at 0).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import ipujax

if (EXAMPLES := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, EXAMPLES)  # examples/, for `shared`: see shared/__init__.py
from shared import load
from shared.flags import TARGETS, UsageError

model = load.example("gpt", "model")
train = load.example("gpt", "train")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="generate.py", description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--checkpoint", required=True, metavar="DIR", help="a folder train.py saved into")
    add("--prompt", default="def ", help="the text to continue (default 'def ')")
    add("--tokens", type=int, default=200, help="bytes to generate (default 200)")
    add("--temperature", type=float, default=0.8, help="sampling temperature, 0 greedy (0.8)")
    add("--seed", type=int, default=0, help="sampling seed (default 0)")
    add("--jax", action="store_true", help="run the forward pass with jax.jit, not ipujax")
    add("--target", choices=sorted(TARGETS), default="bow", help="IPU (default bow)")
    add("--tiles", type=int, default=None, help="tiles per IPU (default: all of the target's)")
    return parser


def make_forward(use_jax: bool, target: str, tiles: int | None = None) -> Any:
    def logits(params: Any, window: jax.Array) -> jax.Array:
        return model.forward(params, window)[0]

    if use_jax:
        return jax.jit(logits)
    chip = TARGETS[target]()
    mesh = ipujax.make_mesh((1,), ("ipu",), target=chip.with_tiles(tiles) if tiles else chip)
    # The weights stay on the IPU between bytes, as a deployed model's do: only the window is sent.
    return ipujax.jit(logits, mesh=mesh, resident_argnums=0)


def sample(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    return int(rng.choice(p.size, p=p / p.sum()))


def generate(
    params: Any,
    config: Any,
    prompt: bytes,
    tokens: int,
    temperature: float,
    seed: int,
    forward: Any,
) -> bytes:
    """The prompt's continuation, `tokens` bytes long."""
    rng = np.random.default_rng(seed)
    text = list(prompt) or [ord("\n")]
    for _ in range(tokens):
        context = text[-config.seq :]
        window = np.zeros((1, config.seq), np.int32)
        window[0, : len(context)] = context  # causal: the padding after it is never attended
        logits = np.asarray(forward(params, jnp.asarray(window)))[len(context) - 1]
        text.append(sample(logits, temperature, rng))
    return bytes(text[len(prompt) :])


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        saved = train.load_checkpoint(args.checkpoint)
    except UsageError as error:
        print(f"generate.py: error: {error}", file=sys.stderr)
        return 2
    forward = make_forward(args.jax, args.target, args.tiles)
    prompt = args.prompt.encode()
    out = generate(
        saved["params"], saved["config"], prompt, args.tokens, args.temperature, args.seed, forward
    )
    how = "jax.jit" if args.jax else "ipujax on one IPU"
    print(f"checkpoint step {saved['step']}, forward pass with {how}", file=sys.stderr)
    sys.stdout.write((prompt + out).decode("utf-8", errors="replace") + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

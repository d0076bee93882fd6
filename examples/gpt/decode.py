"""A GPT decode step with a KV cache: one new token per call, its tokens per second and latency.

    python examples/gpt/decode.py --size gpt2-medium --batch 1,8
    python examples/gpt/decode.py --size tiny --check      # values against jax.jit too
    ipujax cost-report examples/gpt/decode.py:gpt2_medium --mesh tp=4

`decode_step(params, cache, token, pos)` runs `model.py`'s GPT on one token per sequence: each
block projects the token's q, k and v, writes k and v into its layer's cache at `pos`, attends
over the cache's first `pos + 1` positions and runs its MLP; the tied head gives the next
token's logits. It returns the logits and the updated cache, so the cache stays on the IPUs
between calls (an argument a step returns updated is never sent; docs/target.md), and the
weights are marked resident (`ipujax.jit(resident_argnums=0)`): a call sends only the tokens
and the position and returns only the logits. With `--cache streaming` the weights and the
cache live in streaming memory instead and each layer's are loaded in its phase
(`phases=` the `layer{i}` scopes), as a model too large for the chip's SRAM runs.

Each configuration is costed on one IPU and tensor-parallel over a Bow-2000's 4 IPUs (Megatron:
heads, and the cache's heads, split over `tp`; `sharding.py`): tokens per second = batch x the
report's calls per second, latency per token = one call's latency (`CostReport.latency`).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import ipujax

if (EXAMPLES := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, EXAMPLES)  # examples/, for `shared`: see shared/__init__.py
from shared import load
from shared.flags import TARGETS, fail
from shared.transformer import layer_names, layer_norm, pad_vocab

model = load.example("gpt", "model")
sharding = load.example("gpt", "sharding")

Params = dict[str, Any]
SIZES = {
    "tiny": model.Config(vocab=256, seq=64, layers=2, d_model=64, heads=4),
    "gpt2-small": model.Config(
        vocab=pad_vocab(50257), seq=1024, layers=12, d_model=768, heads=12, dtype="float16"
    ),
    "gpt2-medium": model.Config(
        vocab=pad_vocab(50257), seq=1024, layers=24, d_model=1024, heads=16, dtype="float16"
    ),
}
BOW_2000 = 4  # IPUs in one Bow-2000


# ---- the step -----------------------------------------------------------------------------------


def init_cache(config: Any, batch: int, length: int | None = None) -> list[Params]:
    """Each layer's keys and values, [batch, length, heads, head_dim], zero."""
    shape = (batch, length or config.seq, config.heads, config.head_dim)
    zeros = jnp.zeros(shape, config.dtype)
    return [{"k": zeros, "v": zeros} for _ in range(config.layers)]


def _attend(x: jax.Array, p: Params, cache: Params, pos: jax.Array) -> tuple[jax.Array, Params]:
    """One token's attention over the cache, its own k and v written in at `pos`."""
    qkv = jnp.einsum("bd,dhck->bhck", x, p["wqkv"]) + p["bqkv"]
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [batch, heads, head_dim]
    at = (jnp.int32(0), pos, jnp.int32(0), jnp.int32(0))
    keys = jax.lax.dynamic_update_slice(cache["k"], k[:, None], at)
    values = jax.lax.dynamic_update_slice(cache["v"], v[:, None], at)
    scores = jnp.einsum("bhk,bshk->bhs", q, keys) / math.sqrt(q.shape[-1])
    seen = jnp.arange(keys.shape[1]) <= pos  # positions written so far, this one included
    scores = jnp.where(seen, scores, jnp.finfo(scores.dtype).min)
    out = jnp.einsum("bhs,bshk->bhk", jax.nn.softmax(scores, axis=-1), values)
    return jnp.einsum("bhk,hkd->bd", out, p["wo"]) + p["bo"], {"k": keys, "v": values}


def decode_step(
    params: Params, cache: list[Params], token: jax.Array, pos: jax.Array
) -> tuple[jax.Array, list[Params]]:
    """The next token's logits [batch, vocab] after `token` [batch] at position `pos`, and the
    cache with the token's keys and values in it."""
    x = params["wte"][token] + jax.lax.dynamic_index_in_dim(params["wpe"], pos, keepdims=False)
    updated = []
    for i, (p, layer_cache) in enumerate(zip(params["blocks"], cache, strict=True)):
        with jax.named_scope(f"layer{i}"):
            attended, layer_cache = _attend(layer_norm(x, p["ln1"]), p["attn"], layer_cache, pos)
            x = x + attended
            x = x + model.mlp(layer_norm(x, p["ln2"]), p["mlp"])
        updated.append(layer_cache)
    return layer_norm(x, params["lnf"]) @ params["wte"].T, updated


# ---- compiled for a mesh ------------------------------------------------------------------------


def cache_specs(config: Any, mesh: Any) -> list[Params]:
    """The cache split as its heads are: over tp on a Megatron mesh, else whole."""
    heads = "tp" if sharding.strategy(mesh) == "1d" else None
    spec = P(None, None, heads, None)
    return [{"k": spec, "v": spec} for _ in range(config.layers)]


def jit_kwargs(config: Any, mesh: Any, params: Any, cache: str = "chip") -> dict[str, Any]:
    """How to compile the step: the weights resident, the mesh's shardings, and with
    `cache="streaming"` one phase per layer (weights and cache in streaming memory)."""
    if cache not in ("chip", "streaming"):
        raise ValueError(f"cache={cache!r}: use 'chip' or 'streaming'")
    kwargs: dict[str, Any] = {"mesh": mesh, "resident_argnums": (0,)}
    if sharding.strategy(mesh) != "dp":
        sharding.check_divisible(mesh, config.heads)
        specs = (sharding.param_specs(params, mesh), cache_specs(config, mesh), P(None), P())
        kwargs["in_shardings"] = specs
    if cache == "streaming":
        kwargs["phases"] = layer_names(config)
    return kwargs


def shapes(config: Any, batch: int, length: int | None = None) -> tuple[Any, ...]:
    """The step's arguments as shapes only: the weights, the cache, the tokens, the position."""
    params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), config))
    cache = jax.eval_shape(lambda: init_cache(config, batch, length))
    return params, cache, jax.ShapeDtypeStruct((batch,), jnp.int32), jnp.int32(0)


def workload(config: Any, mesh: Any = None, batch: int = 1, cache: str = "chip") -> tuple:
    """(fun, args, jit_kwargs) for the cost-report CLI."""
    mesh = mesh if mesh is not None else ipujax.make_mesh((1,), ("ipu",))
    args = shapes(config, batch)
    return decode_step, args, jit_kwargs(config, mesh, args[0], cache)


def tiny(mesh: Any = None) -> tuple:
    return workload(SIZES["tiny"], mesh)


def gpt2_medium(mesh: Any = None) -> tuple:
    return workload(SIZES["gpt2-medium"], mesh)


def mesh_for(ipus: int, target: ipujax.Target) -> Any:
    """One IPU, or a Megatron mesh over `ipus` (a Bow-2000's 4)."""
    return ipujax.make_mesh((ipus,), ("ipu",) if ipus == 1 else ("tp",), target=target)


def decode_report(
    config: Any, batch: int, mesh: Any, cache: str = "chip", length: int | None = None
) -> ipujax.CostReport:
    """The decode step's cost report (costed from shapes; nothing runs)."""
    args = shapes(config, batch, length)
    jitted = ipujax.jit(decode_step, **jit_kwargs(config, mesh, args[0], cache))
    return jitted.lower(*args).compile(check_memory_fits=False).cost_report()


def rate(report: ipujax.CostReport, batch: int) -> tuple[float, float]:
    """(tokens per second, seconds per token): `batch` tokens a call."""
    call = report.latency
    return batch * call.calls_per_second, call.latency_seconds


# ---- checked against jax.jit --------------------------------------------------------------------


def check(config: Any, batch: int, mesh: Any, steps: int = 3) -> float:
    """Decodes `steps` tokens with ipujax and with jax.jit from the same weights; the largest
    difference of their logits (they must agree to rounding)."""
    params = model.init(jax.random.PRNGKey(0), config)
    ours = ipujax.jit(decode_step, **jit_kwargs(config, mesh, params))
    want = jax.jit(decode_step)
    cache_a = cache_b = init_cache(config, batch)
    tokens = jnp.arange(batch, dtype=jnp.int32) % config.vocab
    worst = 0.0
    for pos in range(steps):
        logits_a, cache_a = ours(params, cache_a, tokens, jnp.int32(pos))
        logits_b, cache_b = want(params, cache_b, tokens, jnp.int32(pos))
        worst = max(worst, float(jnp.max(jnp.abs(logits_a - logits_b))))
        tokens = jnp.argmax(logits_b, axis=-1).astype(jnp.int32)
    return worst


# ---- the command line ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="decode.py", description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--size", choices=sorted(SIZES), default="gpt2-medium", help="model (gpt2-medium)")
    add("--batch", default="1,8", help="sequences decoded at once, comma-separated (1,8)")
    add("--context", type=int, default=None, help="cache positions (default: the model's seq)")
    add("--cache", choices=("chip", "streaming"), default="chip", help="where the cache lives")
    add("--target", choices=sorted(TARGETS), default="bow", help="IPU (default bow)")
    add("--check", action="store_true", help="also decode with jax.jit and compare the logits")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        batches = [int(b) for b in args.batch.split(",")]
    except ValueError:
        return fail(f"--batch {args.batch!r}: expected sizes such as 1,8")
    config, target = SIZES[args.size], TARGETS[args.target]()
    print(f"{args.size}: {config.layers} layers, d_model {config.d_model}, cache {args.cache}")
    print(f"{'mesh':<16} {'batch':>5} {'tokens/s':>10} {'ms/token':>9} {'device ms':>9} fits")
    for ipus in (1, BOW_2000):
        mesh = mesh_for(ipus, target)
        for batch in batches:
            report = decode_report(config, batch, mesh, args.cache, args.context)
            tokens, seconds = rate(report, batch)
            where = "one IPU" if ipus == 1 else f"tp={ipus} Bow-2000"
            device = report.latency.device_seconds * 1e3
            fits = "yes" if report.fits else "NO"
            print(
                f"{where:<16} {batch:>5} {tokens:>10,.0f} {seconds * 1e3:>9.3f} "
                f"{device:>9.3f} {fits}"
            )
            if args.check:
                print(f"  |ipujax - jax.jit| <= {check(config, batch, mesh):.2e} over 3 tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())

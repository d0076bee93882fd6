"""GPT training steps for the cost-report CLI:

    ipujax cost-report examples/gpt/workloads.py:gpt2_small --mesh dp=2,tp=4 --target bow
    ipujax cost-report examples/gpt/workloads.py:gpt3_175b --mesh dp=4,tp1=4,tp2=4 --phases auto
    ipujax cost-report examples/gpt/workloads.py:gpt3_175b_unscoped --mesh dp=4,tp1=8,tp2=8 \
        --target bow --phases auto

Each factory takes an optional `mesh` (the CLI builds it from `--mesh` and `--target`) and
returns `(fun, args, jit_kwargs)`: the AdamW training step of `model.py`, its arguments, and
`{"mesh": mesh, "in_shardings": ...}` with the shardings `sharding.py` derives from the mesh's
axis names (dp; tp for Megatron 1D; tp1 and tp2 for 2D). Without a mesh, `jit_kwargs` is empty
(one IPU). The global batch is the per-replica batch times the size of the mesh's dp axis.

The GPT-2 and GPT-3 workloads are shapes only (`jax.ShapeDtypeStruct`s from `jax.eval_shape` on
the initialisation and the optimizer's init): nothing is allocated, the CLI only costs them.
Their vocabulary, 50,257, is padded to 50,304 (a multiple of 128), as GPT-2 trainers commonly do.

When the mesh has an axis named `pp`, the step is pipelined over it (one stage per IPU of the
axis, stages balanced over the `layer{i}` scopes): the batch is also times `microbatches`
(`MICROBATCHES` by default), and `jit_kwargs["pipeline"]` is
`ipujax.Pipeline(axis="pp", stages="auto", microbatches=..., recompute=True)`.

The GPT-2 and GPT-3 factories take `layers` (the model's depth by default): `ipujax plan` costs
a shallower copy and extrapolates, every layer being alike.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

if (EXAMPLES := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, EXAMPLES)  # examples/, for `shared`: see shared/__init__.py
from shared import load, meshes
from shared.transformer import pad_vocab

model = load.example("gpt", "model")
sharding = load.example("gpt", "sharding")

GPT2_VOCAB = 50257
MICROBATCHES = 16  # per step when pipelined: a 4-stage bubble of 3/19, 16%
POPXL_ACCUMULATION = 32  # GPT-3's micro-batches per step in PopXL's pretraining config
TINY_MICROBATCHES = 4


def _jit_kwargs(
    mesh: Any, params: Any, opt_state: Any, config: Any, microbatches: int = MICROBATCHES
) -> dict[str, Any]:
    return meshes.jit_kwargs(mesh, sharding, (params, opt_state), config.heads, microbatches)


def training_step(
    config: Any,
    batch_per_replica: int,
    mesh: Any = None,
    remat: bool = False,
    microbatches: int = MICROBATCHES,
    scopes: bool = True,
    accumulation: int = 1,
) -> tuple:
    """The training step of `config` with shapes only: (fun, args, jit_kwargs); `scopes=False`
    builds it without named scopes; `accumulation` micro-batches of `batch_per_replica`
    sequences per replica are summed by a scan before each update."""
    optimizer = model.make_optimizer()
    params, opt_state = _state_shapes(config)
    batch = meshes.global_batch(mesh, batch_per_replica, microbatches) * accumulation
    tokens = jax.ShapeDtypeStruct((batch, config.seq + 1), jnp.int32)
    step = model.make_train_step(optimizer, remat, micro_batches=accumulation, scopes=scopes)
    kwargs = _jit_kwargs(mesh, params, opt_state, config, microbatches)
    return step, (params, opt_state, tokens), kwargs


@functools.cache
def _state_shapes(config: Any) -> tuple[Any, Any]:
    """The parameters' and the optimizer state's shapes, the same on every mesh: made once per
    config (`ipujax plan` makes a workload for each mesh it tries, GPT-3's at 0.05 s each)."""
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), config))
    optimizer = model.make_optimizer()
    return params, jax.eval_shape(lambda p: model.init_optimizer(optimizer, p), params)


def tiny(mesh: Any = None) -> tuple:
    """A two-layer GPT small enough to compile and run in seconds, on real arrays."""
    config = model.Config(vocab=256, seq=16, layers=2, d_model=32, heads=4)
    optimizer = model.make_optimizer()
    params = model.init(jax.random.key(0), config)
    opt_state = model.init_optimizer(optimizer, params)
    rng = np.random.default_rng(0)
    batch = meshes.global_batch(mesh, 4, TINY_MICROBATCHES)
    tokens = rng.integers(0, config.vocab, (batch, config.seq + 1), dtype=np.int32)
    step = model.make_train_step(optimizer)
    kwargs = _jit_kwargs(mesh, params, opt_state, config, TINY_MICROBATCHES)
    return step, (params, opt_state, tokens), kwargs


def gpt2_small(mesh: Any = None, layers: int = 12) -> tuple:
    """GPT-2 small (124M): 12 layers, d 768, 12 heads, 1,024 tokens, 8 sequences per replica."""
    config = model.Config(
        vocab=pad_vocab(GPT2_VOCAB), seq=1024, layers=layers, d_model=768, heads=12
    )
    return training_step(config, 8, mesh)


def gpt2_medium(mesh: Any = None, layers: int = 24) -> tuple:
    """GPT-2 medium (350M): 24 layers, d 1024, 16 heads, 1,024 tokens, 8 per replica."""
    config = model.Config(
        vocab=pad_vocab(GPT2_VOCAB), seq=1024, layers=layers, d_model=1024, heads=16
    )
    return training_step(config, 8, mesh)


def _gpt3_config(layers: int) -> Any:
    return model.Config(
        vocab=pad_vocab(GPT2_VOCAB),
        seq=2048,
        layers=layers,
        d_model=12288,
        heads=96,
        dtype="float16",
    )


def gpt3_175b(mesh: Any = None, layers: int = 96, accumulation: int = 1) -> tuple:
    """GPT-3 175B as Graphcore trained it (examples/nlp/gpt3_175B/popxl): 96 layers, d 12,288,
    96 heads, 2,048 tokens, 1 sequence per replica and micro-batch, float16 weights and
    activations with float32 optimizer moments, each block recomputed in the backward pass:
    without that, its activations alone would outgrow the streaming memory of a Pod256.
    `accumulation` micro-batches per step (PopXL's pretraining config: 32, `gpt3_175b_popxl`)."""
    config = _gpt3_config(layers)
    return training_step(config, 1, mesh, remat=True, accumulation=accumulation)


def gpt3_175b_popxl(mesh: Any = None, layers: int = 96) -> tuple:
    """`gpt3_175b` at PopXL's own batch (config/pretraining.yml, release gpt3_175B_pod256): 32
    micro-batches of one sequence per replica, 128 sequences per step on dp=4."""
    return gpt3_175b(mesh, layers, accumulation=POPXL_ACCUMULATION)


def gpt3_175b_unscoped(mesh: Any = None, layers: int = 96, accumulation: int = 1) -> tuple:
    """`gpt3_175b` written as most JAX models are: no `jax.named_scope` anywhere, each block
    under `jax.checkpoint`. `phases="auto"` finds its blocks from the program's structure."""
    config = _gpt3_config(layers)
    return training_step(config, 1, mesh, remat=True, scopes=False, accumulation=accumulation)

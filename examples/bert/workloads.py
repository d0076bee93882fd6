"""BERT pretraining steps (MLM loss, LAMB) for the cost-report CLI:

    ipujax cost-report examples/bert/workloads.py:bert_base --mesh dp=4,tp=4 --target bow
    ipujax cost-report examples/bert/workloads.py:bert_large --mesh dp=4,pp=4 --target mk2

Each factory takes an optional `mesh` (the CLI builds it from `--mesh` and `--target`) and
returns `(fun, args, jit_kwargs)`: the training step of `model.py`, `train_step(params,
opt_state, (tokens, positions, labels))`, its arguments, and `{"mesh": mesh, "in_shardings":
...}` with the shardings `sharding.py` derives from the mesh's axis names (dp splits the batch,
tp the heads and the MLP Megatron-style, any other axis nothing). Without a mesh, `jit_kwargs`
is empty (one IPU).

The global batch is the micro-batch per replica times the size of the mesh's dp axis. When the
mesh has an axis named `pp`, the step is pipelined over it as Graphcore ran BERT (one stage per
IPU of the axis): the batch is also times `microbatches` (Graphcore's gradient accumulation
count; each factory's module constant by default), and `jit_kwargs["pipeline"]` is
`ipujax.Pipeline(axis="pp", stages="auto", microbatches=..., recompute=True)`, each stage's
forward recomputed layer by layer from a checkpoint on every layer's output, as Graphcore's
`recompute_checkpoint_every_layer`.

`bert_base` and `bert_large` take `layers` (the model's depth by default), so that `ipujax plan`
can cost a shallower copy and extrapolate.

BERT-Base and BERT-Large are shapes only (`jax.ShapeDtypeStruct`s from `jax.eval_shape` on the
initialisation and the optimizer's init): nothing is allocated, the CLI only costs them. They
follow Graphcore's PyTorch BERT (graphcore/examples, nlp/bert/pytorch, configs_pretraining.yml,
`pretrain_base_128` and `pretrain_large_128` on a Pod16: 4 replicas of 4 pipelined IPUs):
sequence length 128, 20 masked tokens, micro-batches of 32 (Base) and 8 (Large) sequences,
gradient accumulation 512 and 2048 (global batch 65,536 either way), float16 weights and
activations with float32 optimizer moments, LAMB with weight decay 0.01. The vocabulary, 30,522,
is padded to 30,592 (a multiple of 128).
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

model = load.example("bert", "model")
sharding = load.example("bert", "sharding")

BERT_VOCAB = 30522
DATA_AXIS, PIPELINE_AXIS = "dp", meshes.PIPELINE_AXIS  # the axes Graphcore ran BERT over
TINY_MICROBATCHES = 16  # tiny's micro-batches per step when pipelined
BASE_MICROBATCHES = 512  # pretrain_base_128's gradient_accumulation
LARGE_MICROBATCHES = 2048  # pretrain_large_128's gradient_accumulation
TINY = model.Config(vocab=128, seq=16, layers=2, d_model=32, heads=4, mask_tokens=4)


def batch_shapes(config: Any, batch: int) -> tuple[jax.ShapeDtypeStruct, ...]:
    """(tokens [batch, seq], positions and labels [batch, mask_tokens]), int32."""
    tokens = jax.ShapeDtypeStruct((batch, config.seq), jnp.int32)
    masked = jax.ShapeDtypeStruct((batch, config.mask_tokens), jnp.int32)
    return tokens, masked, masked


def random_batch(config: Any, batch: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Synthetic MLM data: random tokens, `mask_tokens` distinct random positions per sequence,
    and as labels the tokens that were there (the inputs are not masked: a shapes-true stand-in
    for real data, no download)."""
    tokens = rng.integers(0, config.vocab, (batch, config.seq), dtype=np.int32)
    order = np.argsort(rng.random((batch, config.seq)), axis=1)
    positions = np.sort(order[:, : config.mask_tokens], axis=1).astype(np.int32)
    labels = np.take_along_axis(tokens, positions, axis=1)
    return tokens, positions, labels


def training_step(config: Any, micro_batch: int, mesh: Any, microbatches: int) -> tuple:
    """The training step of `config` with shapes only: (fun, args, jit_kwargs); pipelined, the
    optimizer state stays off chip, as in Graphcore's BERT configs."""
    params, opt_state = _state_shapes(config)
    batch = batch_shapes(config, meshes.global_batch(mesh, micro_batch, microbatches))
    step = model.make_train_step(model.make_optimizer())
    kwargs = meshes.jit_kwargs(
        mesh, sharding, (params, opt_state), config.heads, microbatches, offchip=True
    )
    return step, (params, opt_state, batch), kwargs


@functools.cache
def _state_shapes(config: Any) -> tuple[Any, Any]:
    """The parameters' and the optimizer state's shapes, the same on every mesh: made once per
    config (`ipujax plan` makes a workload for each mesh it tries)."""
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), config))
    return params, jax.eval_shape(model.make_optimizer().init, params)


def tiny(mesh: Any = None, microbatches: int | None = None) -> tuple:
    """A two-layer BERT small enough to compile and run in seconds, on real arrays: d 32, 4
    heads, 16 tokens with 4 masked, 4 sequences per replica (per micro-batch when pipelined,
    `TINY_MICROBATCHES` of them by default)."""
    config = TINY
    microbatches = TINY_MICROBATCHES if microbatches is None else microbatches
    optimizer = model.make_optimizer()
    params = model.init(jax.random.key(0), config)
    opt_state = optimizer.init(params)
    rng = np.random.default_rng(0)
    batch = random_batch(config, meshes.global_batch(mesh, 4, microbatches), rng)
    step = model.make_train_step(optimizer)
    kwargs = meshes.jit_kwargs(mesh, sharding, (params, opt_state), config.heads, microbatches)
    return step, (params, opt_state, batch), kwargs


def _pretraining(layers: int, d_model: int, heads: int) -> Any:
    """BERT as Graphcore pretrained it (phase 1): the padded vocabulary, 128 tokens of which 20
    are masked, float16."""
    return model.Config(
        vocab=pad_vocab(BERT_VOCAB),
        seq=128,
        layers=layers,
        d_model=d_model,
        heads=heads,
        mask_tokens=20,
        dtype="float16",
    )


def bert_base(mesh: Any = None, microbatches: int | None = None, layers: int = 12) -> tuple:
    """BERT-Base (110M): 12 layers, d 768, 12 heads, float16, 32 sequences per replica (per
    micro-batch when pipelined, `BASE_MICROBATCHES` of them by default)."""
    microbatches = BASE_MICROBATCHES if microbatches is None else microbatches
    return training_step(_pretraining(layers, 768, 12), 32, mesh, microbatches)


def bert_large(mesh: Any = None, microbatches: int | None = None, layers: int = 24) -> tuple:
    """BERT-Large (335M): 24 layers, d 1024, 16 heads, float16, 8 sequences per replica (per
    micro-batch when pipelined, `LARGE_MICROBATCHES` of them by default: on a Pod16 as
    `--mesh dp=4,pp=4`, 8 x 4 x 2048 = 65,536 sequences per step)."""
    microbatches = LARGE_MICROBATCHES if microbatches is None else microbatches
    return training_step(_pretraining(layers, 1024, 16), 8, mesh, microbatches)

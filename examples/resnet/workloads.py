"""ResNet training steps for the cost-report CLI:

    ipujax cost-report examples/resnet/workloads.py:resnet50 --mesh dp=16 --target mk2
    ipujax cost-report examples/resnet/workloads.py:small --mesh dp=4

Each factory takes an optional `mesh` (the CLI builds it from `--mesh` and `--target`) and
returns `(fun, args, jit_kwargs)`: the training step of `model.py` (`train_step(params,
bn_state, opt_state, images, labels)`), its arguments as shapes only (`jax.ShapeDtypeStruct`s
from `jax.eval_shape` on the initialisation and the optimizer's init: nothing is allocated) and
`{"mesh": mesh, "in_shardings": ...}` from `sharding.py` (images and labels split over dp,
everything else replicated). Without a mesh, `jit_kwargs` is empty (one IPU). The global batch
is the per-replica batch times the size of the mesh's dp axis.

`resnet50` follows Graphcore's public PyTorch CNN example (graphcore/examples,
vision/cnns/pytorch): its config `resnet50_mk2` (ResNet-50 on an Mk2 IPU-POD16, one IPU per
replica; named `resnet50` in the example's later train/configs.yml) trains with a micro-batch of
18 images per replica, 16 replicas, batch norm, float16 weights and activations ("16.16") and
gradient accumulation 57, and 8-bit images from the host ("eight_bit_io"). The step is
`accumulation` micro-batches' forward and backward (1 by default) and one update, with SGD and
momentum 0.9 by default as there.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

if (EXAMPLES := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, EXAMPLES)  # examples/, for `shared`: see shared/__init__.py
from shared import load

model = load.example("resnet", "model")
sharding = load.example("resnet", "sharding")

GRAPHCORE_MICRO_BATCH = 18  # images per replica in Graphcore's resnet50_mk2 config


def _jit_kwargs(mesh: Any, accumulation: int = 1, per_replica: bool = False) -> dict[str, Any]:
    if mesh is None:
        return {}
    return {"mesh": mesh, "in_shardings": sharding.train_specs(mesh, accumulation, per_replica)}


def training_step(
    config: Any,
    batch_per_replica: int,
    mesh: Any = None,
    optimizer: str = "sgd",
    remat: bool = False,
    accumulation: int = 1,
    replica_norm: bool = False,
    image_dtype: Any = None,
    state_dtype: Any = "float32",
) -> tuple:
    """The training step of `config` with shapes only: (fun, args, jit_kwargs). Images are
    NHWC (in `image_dtype`, by default the model's), labels int32, both with a leading dim of
    `accumulation` micro-batches when it is over 1; the global batch is per replica times dp.
    `replica_norm` normalises each replica's share of the batch apart, with each replica's
    own running statistics ([replicas, C], split over dp)."""
    opt = model.make_optimizer(optimizer)
    params, bn_state = jax.eval_shape(lambda: model.init(config, jax.random.key(0)))
    opt_state = jax.eval_shape(lambda p: model.init_optimizer(opt, p, state_dtype), params)
    replicas = sharding.dp_size(mesh)
    if replica_norm and replicas > 1:  # each replica's own running statistics
        bn_state = jax.tree.map(
            lambda s: jax.ShapeDtypeStruct((replicas, *s.shape), s.dtype), bn_state
        )
    batch = batch_per_replica * replicas
    lead = (accumulation,) if accumulation > 1 else ()
    size, channels = config.image_size, config.channels
    pixels = jnp.dtype(image_dtype or config.dtype)
    images = jax.ShapeDtypeStruct((*lead, batch, size, size, channels), pixels)
    labels = jax.ShapeDtypeStruct((*lead, batch), jnp.int32)
    groups = replicas if replica_norm else 1
    step = model.make_train_step(opt, config, remat, groups, accumulation)
    return (
        step,
        (params, bn_state, opt_state, images, labels),
        _jit_kwargs(mesh, accumulation, replica_norm),
    )


def resnet50(
    mesh: Any = None,
    batch_per_replica: int = GRAPHCORE_MICRO_BATCH,
    dtype: str = "float16",
    optimizer: str = "sgd",
    accumulation: int = 1,
) -> tuple:
    """ResNet-50 on 224x224 ImageNet images, float16 by default, as Graphcore trained it:
    18 images per replica, batch norm over each replica's own batch, 8-bit images from the
    host, SGD with momentum kept in the model's type (or `optimizer="lars"`, the large-batch
    optimizer), and with
    `accumulation` micro-batches' gradients summed before each update. Each residual block is
    recomputed in the backward pass (Graphcore's config recomputes from checkpoints at the
    residual additions): without that, 18 images' activations outgrow an IPU's memory."""
    config = model.resnet50_config(dtype)
    return training_step(
        config,
        batch_per_replica,
        mesh,
        optimizer,
        remat=True,
        accumulation=accumulation,
        replica_norm=True,
        image_dtype=jnp.uint8,
        state_dtype=dtype,
    )


def small(mesh: Any = None) -> tuple:
    """The CIFAR-sized ResNet `train.py` trains (32x32x3, float32), 8 images per replica."""
    return training_step(model.small_config(), 8, mesh)

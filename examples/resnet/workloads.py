"""ResNet training steps for the cost-report CLI:

    ipujax cost-report examples/resnet/workloads.py:resnet50 --mesh dp=16 --target mk2
    ipujax cost-report examples/resnet/workloads.py:small --mesh dp=4
    ipujax cost-report examples/resnet/workloads.py:resnet50_bow --mesh dp=16 --target bow

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
momentum 0.9 by default as there. `resnet50_mk2` and `resnet50_bow` are the whole steps
Graphcore's configs ran, with their accumulation, recomputation checkpoints and memory
proportion (`GraphcoreRun`): the fidelity rows of docs/fidelity.md compile them.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

if (EXAMPLES := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, EXAMPLES)  # examples/, for `shared`: see shared/__init__.py
from shared import load

import ipujax

model = load.example("resnet", "model")
sharding = load.example("resnet", "sharding")

GRAPHCORE_MICRO_BATCH = 18  # images per replica in Graphcore's resnet50_mk2 config

# Graphcore's recomputation checkpoints, as the blocks whose outputs are kept (`model.segments`):
# - PyTorch, vision/cnns/pytorch/train/configs.yml `resnet50` (resnet50_mk2): checkpoints at the
#   residual additions add, add_1, add_2, add_3, add_5, add_6, add_7, add_9, add_11 and add_12
#   (torch numbers them in order: layer1 add..add_2, layer2 add_3..add_6, layer3 add_7..add_12),
#   and every convolution and batch norm of layer4, which is so kept whole, with the head;
PYTORCH_CHECKPOINTS = (
    "stage1/block0",
    "stage1/block1",
    "stage1/block2",
    "stage2/block0",
    "stage2/block2",
    "stage2/block3",
    "stage3/block0",
    "stage3/block2",
    "stage3/block4",
    "stage3/block5",
)
# - TensorFlow 1, vision/cnns/tensorflow1/training/configs.yml resnet50_mlperf_pod16_bs20 and
#   _pod64_bs20 (the Bow rows' configurations): a one-IPU pipeline recomputed stage by stage,
#   split at stage1/unit1/relu, stage1/unit3/relu, stage2/unit1/relu, stage2/unit3/relu,
#   stage3/unit1/relu and stage3/unit4/relu (units count from 1, blocks here from 0).
TF1_CHECKPOINTS = (
    "stage1/block0",
    "stage1/block2",
    "stage2/block0",
    "stage2/block2",
    "stage3/block0",
    "stage3/block3",
)


@dataclass(frozen=True)
class GraphcoreRun:
    """How a Graphcore config trained ResNet-50 on each replica: images per micro-batch,
    micro-batches accumulated per update, recomputation checkpoints, and the convolution
    planner's `availableMemoryProportion` (the Target's `available_memory_proportion`)."""

    micro_batch: int
    accumulation: int
    checkpoints: tuple[str, ...]
    memory_proportion: float


# PyTorch `resnet50` (resnet50_mk2): 18 images, 57 accumulated, available_memory_proportion 0.16.
MK2_POD16 = GraphcoreRun(18, 57, PYTORCH_CHECKPOINTS, 0.16)
# TensorFlow 1 resnet50_mlperf_pod16_bs20 (20 images, 6 accumulated, 0.15) and
# resnet50_mlperf_pod64_bs20 (20 images, 2 accumulated, 0.145). No Pod256 config is published
# there; Graphcore's Pod256 batch (10,240) is the Pod64 config's on 256 replicas.
BOW_POD16 = GraphcoreRun(20, 6, TF1_CHECKPOINTS, 0.15)
BOW_POD64 = GraphcoreRun(20, 2, TF1_CHECKPOINTS, 0.145)


def as_graphcore_ran(mesh: Any, run: GraphcoreRun, alone: ipujax.Target) -> tuple:
    """`resnet50` with a config's settings: its micro-batch, accumulation and checkpoints, and
    its memory proportion on the mesh's target (without a mesh, on one IPU of `alone`)."""
    target = mesh.target if mesh is not None else alone
    planned = dataclasses.replace(target, available_memory_proportion=run.memory_proportion)
    if mesh is None:
        mesh = ipujax.make_mesh((1,), ("dp",), target=planned)
    else:
        mesh = dataclasses.replace(mesh, target=planned)
    return resnet50(
        mesh,
        batch_per_replica=run.micro_batch,
        accumulation=run.accumulation,
        checkpoints=run.checkpoints,
    )


def resnet50_mk2(mesh: Any = None) -> tuple:
    """ResNet-50's whole step as Graphcore's PyTorch config trained it on an MK2 Pod16
    (`MK2_POD16`): 57 micro-batches of 18 images accumulated, then one update."""
    return as_graphcore_ran(mesh, MK2_POD16, ipujax.Target.mk2())


def resnet50_bow(mesh: Any = None) -> tuple:
    """ResNet-50's whole step as Graphcore's TensorFlow 1 configs trained it on Bow Pods:
    `BOW_POD16` on up to 16 replicas, `BOW_POD64` on more."""
    run = BOW_POD16 if sharding.dp_size(mesh) <= 16 else BOW_POD64
    return as_graphcore_ran(mesh, run, ipujax.Target.bow())


def _jit_kwargs(mesh: Any, accumulation: int = 1, per_replica: bool = False) -> dict[str, Any]:
    if mesh is None:
        return {}
    return {"mesh": mesh, "in_shardings": sharding.train_specs(mesh, accumulation, per_replica)}


def training_step(
    config: Any,
    batch_per_replica: int,
    mesh: Any = None,
    optimizer: str = "sgd",
    remat: Any = False,
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
    checkpoints: Any = True,
) -> tuple:
    """ResNet-50 on 224x224 ImageNet images, float16 by default, as Graphcore trained it:
    18 images per replica, batch norm over each replica's own batch, 8-bit images from the
    host, SGD with momentum kept in the model's type (or `optimizer="lars"`, the large-batch
    optimizer), and with
    `accumulation` micro-batches' gradients summed before each update. The backward pass
    recomputes activations (`model.segments`): by default each residual block from its input;
    `checkpoints` names the blocks whose outputs are kept instead, as Graphcore's
    configurations do (`PYTORCH_CHECKPOINTS`, `TF1_CHECKPOINTS`). Without recomputation, 18
    images' activations outgrow an IPU's memory."""
    config = model.resnet50_config(dtype)
    return training_step(
        config,
        batch_per_replica,
        mesh,
        optimizer,
        remat=checkpoints,
        accumulation=accumulation,
        replica_norm=True,
        image_dtype=jnp.uint8,
        state_dtype=dtype,
    )


def small(mesh: Any = None) -> tuple:
    """The CIFAR-sized ResNet `train.py` trains (32x32x3, float32), 8 images per replica."""
    return training_step(model.small_config(), 8, mesh)

"""An EfficientNet-like network in plain JAX (jax.numpy and jax.lax, no flax) on NHWC images,
with grouped convolutions of group width 16 as Graphcore trained EfficientNet on IPUs (their
"G16" variant: each depthwise convolution becomes a grouped one of 16 channels per group, which
the AMP runs at full width), and the training step the tests partition data parallel.

- A stem (3x3 convolution, batch norm, swish), then MBConv blocks: a 1x1 expansion, a grouped
  kxk convolution (`feature_group_count` = channels / 16), squeeze-and-excitation, a 1x1
  projection, and a residual add when the shape is kept; a 1x1 head, global average pooling
  and a linear classifier. Each block runs under `jax.named_scope`.
- Batch norm runs in training mode over the batch the step is given (over a data-parallel
  mesh axis the partitioner makes it distributed batch norm by itself), statistics in float32.
- jax writes each grouped convolution's weight gradient as a convolution with
  `batch_group_count` > 1, the images contracted: under data parallelism a partial sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

Params = dict[str, Any]

DIMENSIONS = ("NHWC", "HWIO", "NHWC")
GROUP_WIDTH = 16  # channels per group of the grouped convolutions (Graphcore's G16)
BN_EPS = 1e-5


@dataclass(frozen=True)
class Block:
    """An MBConv block: `channels` in and out, expanded `expand` times, a `kernel` x `kernel`
    grouped convolution with `stride`."""

    channels: int
    out: int
    expand: int = 4
    kernel: int = 3
    stride: int = 1

    @property
    def wide(self) -> int:
        return self.channels * self.expand


@dataclass(frozen=True)
class Config:
    """The stem's width, the blocks in order, the head's width and the classes."""

    stem: int = 16
    blocks: tuple[Block, ...] = (Block(16, 16), Block(16, 32, stride=2, kernel=5))
    head: int = 64
    num_classes: int = 10
    image_size: int = 8
    channels: int = 3
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for block in self.blocks:
            if block.wide % GROUP_WIDTH:
                raise ValueError(f"{block}: expanded channels are not groups of {GROUP_WIDTH}")


def _conv_init(key: jax.Array, k: int, cin: int, cout: int) -> jax.Array:
    """He-normal (fan in) HWIO kernel; `cin` is the input channels of one group."""
    return math.sqrt(2.0 / (k * k * cin)) * jax.random.normal(key, (k, k, cin, cout))


def _bn_init(c: int) -> Params:
    return {"scale": jnp.ones(c, jnp.float32), "bias": jnp.zeros(c, jnp.float32)}


def _block_init(key: jax.Array, b: Block) -> Params:
    k = jax.random.split(key, 5)
    squeeze = max(1, b.channels // 4)
    return {
        "expand": _conv_init(k[0], 1, b.channels, b.wide),
        "bn0": _bn_init(b.wide),
        "grouped": _conv_init(k[1], b.kernel, GROUP_WIDTH, b.wide),
        "bn1": _bn_init(b.wide),
        "se_reduce": _conv_init(k[2], 1, b.wide, squeeze)[0, 0],
        "se_expand": _conv_init(k[3], 1, squeeze, b.wide)[0, 0],
        "project": _conv_init(k[4], 1, b.wide, b.out),
        "bn2": _bn_init(b.out),
    }


def init(key: jax.Array, config: Config) -> Params:
    """The parameters, convolution weights in `config.dtype` and batch norm's in float32."""
    keys = jax.random.split(key, len(config.blocks) + 3)
    last = config.blocks[-1].out if config.blocks else config.stem
    params: Params = {
        "stem": _conv_init(keys[0], 3, config.channels, config.stem),
        "stem_bn": _bn_init(config.stem),
        "blocks": [_block_init(k, b) for k, b in zip(keys[1:], config.blocks, strict=False)],
        "head": _conv_init(keys[-2], 1, last, config.head),
        "head_bn": _bn_init(config.head),
        "classifier": 0.1 * jax.random.normal(keys[-1], (config.head, config.num_classes)),
    }
    dtype = jnp.dtype(config.dtype)
    return jax.tree.map(lambda x: x if x.ndim == 1 else x.astype(dtype), params)


def conv(x: jax.Array, w: jax.Array, stride: int = 1, groups: int = 1) -> jax.Array:
    k = w.shape[0]
    pad = ((k // 2, k // 2),) * 2
    return lax.conv_general_dilated(
        x, w, (stride, stride), pad, dimension_numbers=DIMENSIONS, feature_group_count=groups
    )


def batch_norm(x: jax.Array, p: Params) -> jax.Array:
    """Training-mode batch norm over (N, H, W), statistics in float32."""
    wide = x.astype(jnp.float32)
    mean = jnp.mean(wide, axis=(0, 1, 2))
    var = jnp.mean(jnp.square(wide - mean), axis=(0, 1, 2))
    y = (wide - mean) * lax.rsqrt(var + BN_EPS) * p["scale"] + p["bias"]
    return y.astype(x.dtype)


def swish(x: jax.Array) -> jax.Array:
    return x * jax.nn.sigmoid(x)


def mbconv(x: jax.Array, p: Params, b: Block) -> jax.Array:
    """Expansion, grouped convolution, squeeze-and-excitation, projection, residual."""
    h = swish(batch_norm(conv(x, p["expand"]), p["bn0"]))
    h = conv(h, p["grouped"], b.stride, groups=b.wide // GROUP_WIDTH)
    h = swish(batch_norm(h, p["bn1"]))
    squeezed = swish(jnp.mean(h, axis=(1, 2)) @ p["se_reduce"])
    h = h * jax.nn.sigmoid(squeezed @ p["se_expand"])[:, None, None, :]
    h = batch_norm(conv(h, p["project"]), p["bn2"])
    return x + h if b.stride == 1 and b.channels == b.out else h


def forward(params: Params, x: jax.Array, config: Config) -> jax.Array:
    """Logits of a batch of NHWC images."""
    x = x.astype(jnp.dtype(config.dtype))
    with jax.named_scope("stem"):
        h = swish(batch_norm(conv(x, params["stem"]), params["stem_bn"]))
    for i, (p, b) in enumerate(zip(params["blocks"], config.blocks, strict=True)):
        with jax.named_scope(f"block{i}"):
            h = mbconv(h, p, b)
    with jax.named_scope("head"):
        h = swish(batch_norm(conv(h, params["head"]), params["head_bn"]))
        pooled = jnp.mean(h.astype(jnp.float32), axis=(1, 2))
        return pooled @ params["classifier"].astype(jnp.float32)


def loss(params: Params, x: jax.Array, labels: jax.Array, config: Config) -> jax.Array:
    """Mean softmax cross entropy over the batch, in float32."""
    logits = forward(params, x, config)
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=-1)
    return -jnp.mean(picked)


def train_step(
    params: Params, x: jax.Array, labels: jax.Array, config: Config, lr: float = 0.1
) -> tuple[jax.Array, Params]:
    """One SGD step: the loss and the updated parameters."""
    value, grads = jax.value_and_grad(loss)(params, x, labels, config)
    updated = jax.tree.map(lambda p, g: p - (lr * g).astype(p.dtype), params, grads)
    return value, updated

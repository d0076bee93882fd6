"""A ResNet in plain JAX (jax.numpy and jax.lax, no flax) on NHWC images, and the training step
that `train.py` runs and `workloads.py` costs.

- Convolutions are `lax.conv_general_dilated` with dimension numbers ("NHWC", "HWIO", "NHWC")
  and explicit symmetric padding (k // 2 each side), as torchvision pads; max pooling is
  `lax.reduce_window`, whose gradient jax writes as a `select_and_scatter`.
- Batch norm runs in training mode: the mean and the mean of squares are `jnp.mean` over
  (N, H, W) of the batch the step is given, in one pass (sibling reductions, which Poplar runs
  together), accumulated in float32, with a learnable scale and bias. When that
  batch is split over a data-parallel mesh axis, the means are over the whole (global) batch, so
  the partitioner adds the AllReduces of a distributed (synchronised) batch norm by itself. The
  running statistics are state (`init` makes them, the training step returns them updated with
  momentum) and `forward(..., train=False)` normalises with them.
- Blocks are torchvision's: basic (two 3x3 convolutions) or bottleneck (1x1, 3x3, 1x1 with 4x
  expansion, the stride on the 3x3 as in ResNet v1.5), a 1x1 projection on the shortcut when the
  shape changes. Each runs under `jax.named_scope` ("stem", "stage1/block0", ..., "head");
  with `remat`, each block is recomputed in the backward pass, or each run of blocks between
  named checkpoints (`segments`).
- `Config.dtype` is the parameters' and activations' type (float16 for the ResNet-50 workload,
  as Graphcore's "16.16"); batch statistics, the loss and the optimizer's state are float32.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax

Params = dict[str, Any]

DIMENSIONS = ("NHWC", "HWIO", "NHWC")
BN_EPS = 1e-5
BN_MOMENTUM = 0.9  # running = momentum * running + (1 - momentum) * batch statistic
OPTIMIZERS = ("sgd", "lars", "lamb")


@dataclass(frozen=True)
class Config:
    """A ResNet: a stem (convolution, batch norm, ReLU, max pool), stages of residual blocks
    (the first block of every stage but the first halves the image), global average pooling
    and a linear classifier.

    `widths` are the stages' base widths (the 3x3 convolutions' channels); a stage's output has
    `widths[i] * expansion` channels (4 for bottleneck blocks, 1 for basic ones)."""

    widths: tuple[int, ...] = (16, 32, 64)
    blocks: tuple[int, ...] = (1, 1, 1)
    bottleneck: bool = False
    num_classes: int = 10
    image_size: int = 32
    channels: int = 3
    stem_width: int = 16
    stem_kernel: int = 3
    stem_stride: int = 1
    pool_window: int = 2
    pool_stride: int = 2
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if len(self.widths) != len(self.blocks) or not self.widths:
            raise ValueError(f"widths {self.widths} and blocks {self.blocks} differ in length")
        if min(self.blocks) < 1:
            raise ValueError(f"every stage needs a block: blocks {self.blocks}")

    @property
    def expansion(self) -> int:
        return 4 if self.bottleneck else 1

    @property
    def features(self) -> int:
        """Channels of the last stage: the classifier's input."""
        return self.widths[-1] * self.expansion

    @property
    def pool_padding(self) -> int:
        """Max pooling pads (window - 1) // 2 each side: 1 for 3x3/2 (ImageNet), 0 for 2x2/2."""
        return (self.pool_window - 1) // 2

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resnet50_config(dtype: str = "float16") -> Config:
    """ResNet-50 for ImageNet: 224x224x3 images, a 7x7/2 stem to 64 channels and a 3x3/2 max
    pool, bottleneck blocks [3, 4, 6, 3] of widths 64..512 (outputs 256..2048), 1000 classes."""
    return Config(
        widths=(64, 128, 256, 512),
        blocks=(3, 4, 6, 3),
        bottleneck=True,
        num_classes=1000,
        image_size=224,
        stem_width=64,
        stem_kernel=7,
        stem_stride=2,
        pool_window=3,
        pool_stride=2,
        dtype=dtype,
    )


def small_config(dtype: str = "float32") -> Config:
    """A CIFAR-sized ResNet: 32x32x3 images, a 3x3 stem to 16 channels and a 2x2/2 max pool,
    one basic block in each of three stages of widths 16, 32, 64, 10 classes."""
    return Config(dtype=dtype)


def block_names(config: Config) -> list[str]:
    """The named scopes of the residual blocks, in order: 'stage1/block0', ..."""
    return [f"stage{s + 1}/block{b}" for s, count in enumerate(config.blocks) for b in range(count)]


def _stride(stage: int, block: int) -> int:
    return 2 if stage > 0 and block == 0 else 1


# ---- parameters and state -----------------------------------------------------------------------


def _cast(tree: Any, dtype: Any) -> Any:
    return jax.tree.map(lambda x: x.astype(dtype), tree)


def wide(dtype: Any) -> Any:
    """The type statistics, the loss and updates are computed in: float32, or float64 for a
    float64 model (`train.py --check` runs one as its arbiter)."""
    return jnp.promote_types(dtype, jnp.float32)


def _conv_init(key: jax.Array, k: int, cin: int, cout: int) -> jax.Array:
    """He-normal (fan in) HWIO kernel, as torchvision initialises ResNets."""
    std = math.sqrt(2.0 / (k * k * cin))
    return std * jax.random.normal(key, (k, k, cin, cout), jnp.float32)


def _bn_init(c: int) -> tuple[Params, Params]:
    """Batch norm's parameters (scale 1, bias 0) and running statistics (mean 0, variance 1)."""
    params = {"scale": jnp.ones(c, jnp.float32), "bias": jnp.zeros(c, jnp.float32)}
    state = {"mean": jnp.zeros(c, jnp.float32), "var": jnp.ones(c, jnp.float32)}
    return params, state


def _conv_bn(key: jax.Array, k: int, cin: int, cout: int) -> tuple[Params, Params]:
    """A convolution followed by batch norm: ({'w', 'bn'} params, {'bn'} state)."""
    bn, stats = _bn_init(cout)
    return {"w": _conv_init(key, k, cin, cout), "bn": bn}, {"bn": stats}


def _block_init(
    key: jax.Array, config: Config, cin: int, width: int, stride: int
) -> tuple[Params, Params]:
    cout = width * config.expansion
    if config.bottleneck:
        shapes = [(1, cin, width), (3, width, width), (1, width, cout)]
    else:
        shapes = [(3, cin, width), (3, width, cout)]
    keys = jax.random.split(key, len(shapes) + 1)
    params, state = {}, {}
    for i, (k, a, b) in enumerate(shapes):
        params[f"conv{i + 1}"], state[f"conv{i + 1}"] = _conv_bn(keys[i], k, a, b)
    if stride != 1 or cin != cout:
        params["proj"], state["proj"] = _conv_bn(keys[-1], 1, cin, cout)
    return params, state


def init(config: Config, key: jax.Array) -> tuple[Params, Params]:
    """(params, bn_state): the parameters in `config.dtype`, batch norm's running statistics in
    float32. Both trees share their structure down to each batch norm."""
    keys = jax.random.split(key, 2 + sum(config.blocks))
    stem, stem_state = _conv_bn(keys[0], config.stem_kernel, config.channels, config.stem_width)
    stages, stage_states = [], []
    cin, i = config.stem_width, 2
    for s, (width, count) in enumerate(zip(config.widths, config.blocks, strict=True)):
        blocks, block_states = [], []
        for b in range(count):
            p, st = _block_init(keys[i], config, cin, width, _stride(s, b))
            blocks.append(p)
            block_states.append(st)
            cin, i = width * config.expansion, i + 1
        stages.append(blocks)
        stage_states.append(block_states)
    head = {
        "w": jax.random.normal(keys[1], (cin, config.num_classes), jnp.float32) / math.sqrt(cin),
        "b": jnp.zeros(config.num_classes, jnp.float32),
    }
    params = {"stem": stem, "stages": stages, "head": head}
    return _cast(params, config.dtype), {"stem": stem_state, "stages": stage_states}


# ---- forward ------------------------------------------------------------------------------------


def conv(x: jax.Array, w: jax.Array, stride: int = 1) -> jax.Array:
    """A 'same'-style convolution: k // 2 padding each side, so stride s divides H and W by s."""
    pad = w.shape[0] // 2
    return lax.conv_general_dilated(
        x, w, (stride, stride), ((pad, pad), (pad, pad)), dimension_numbers=DIMENSIONS
    )


def _moments(x: jax.Array, replicas: int) -> tuple[jax.Array, jax.Array]:
    """Mean and (biased) variance over (N, H, W) of each replica's share of the batch,
    [replicas, C], accumulated in float32 (or float64), in one pass over `x`: the variance is
    the mean of squares less the squared mean, as PopLibs computes batch norm's statistics
    (graphcore/poplibs lib/poplin/Norms.cpp, `normStatisticsImpl`: the mean and the "power"
    reduced in the same compute sets) and as flax's `BatchNorm` does by default."""
    acc = wide(x.dtype)
    x = x.reshape(replicas, -1, *x.shape[1:])
    mean = jnp.mean(x, axis=(1, 2, 3), dtype=acc)
    power = jnp.mean(jnp.square(x.astype(acc)), axis=(1, 2, 3))
    return mean, jnp.maximum(power - jnp.square(mean), 0)


def batch_norm(
    x: jax.Array, p: Params, stats: Params, train: bool = True, replicas: int = 1
) -> tuple[jax.Array, Params]:
    """Batch norm over (N, H, W): with the batch's statistics when training (and the running
    statistics updated with momentum), else with the running ones.

    Training, each of `replicas` consecutive shares of the batch is normalised by its own
    statistics, as data-parallel replicas normalise over their own batch (Graphcore's
    ResNets); with `replicas=1` the whole batch is one (over a dp mesh, a batch norm
    synchronised across replicas: its sums are AllReduced). Running statistics of shape
    [replicas, C] are each replica's own (no collective); of shape [C], the replicas'
    statistics are averaged into them. The statistics are float32,
    computed under `jax.checkpoint` so that the backward pass recomputes them from `x` rather
    than keeping a float32 copy of the activation; the normalisation is `x * a + b` in the
    activation's type, with per-channel a and b."""
    apart = stats["mean"].ndim == 2  # running statistics [replicas, C], each replica's own
    if train:
        mean, var = jax.checkpoint(_moments, static_argnums=1)(x, replicas)
        if not apart:
            mean_, var_ = mean.mean(axis=0), var.mean(axis=0)
        new = {
            "mean": BN_MOMENTUM * stats["mean"]
            + (1 - BN_MOMENTUM) * lax.stop_gradient(mean if apart else mean_),
            "var": BN_MOMENTUM * stats["var"]
            + (1 - BN_MOMENTUM) * lax.stop_gradient(var if apart else var_),
        }
    else:
        mean, var, new = stats["mean"], stats["var"], stats
        if apart:
            mean, var = mean.mean(axis=0), var.mean(axis=0)
        mean, var = mean[None], var[None]
    a = p["scale"].astype(mean.dtype) * lax.rsqrt(var + BN_EPS)
    b = p["bias"].astype(mean.dtype) - mean * a
    shares = x.reshape(mean.shape[0], -1, *x.shape[1:])
    y = shares * a[:, None, None, None].astype(x.dtype) + b[:, None, None, None].astype(x.dtype)
    return y.reshape(x.shape), new


def conv_bn(
    x: jax.Array, p: Params, s: Params, stride: int, train: bool, replicas: int = 1
) -> tuple[jax.Array, Params]:
    y, bn = batch_norm(conv(x, p["w"], stride), p["bn"], s["bn"], train, replicas)
    return y, {"bn": bn}


def max_pool(x: jax.Array, window: int, stride: int, pad: int) -> jax.Array:
    """Max pooling over H and W with `lax.reduce_window` (padding never wins: it is -inf)."""
    return lax.reduce_window(
        x,
        -jnp.inf,
        lax.max,
        (1, window, window, 1),
        (1, stride, stride, 1),
        ((0, 0), (pad, pad), (pad, pad), (0, 0)),
    )


def block(
    x: jax.Array, p: Params, s: Params, stride: int, train: bool, replicas: int = 1
) -> tuple[jax.Array, Params]:
    """A residual block: convolutions with batch norm and ReLU between them; the stride on the
    3x3 convolution; the shortcut projected when the shape changes; ReLU after the sum."""
    names = sorted(k for k in p if k.startswith("conv"))
    strided = "conv2" if len(names) == 3 else "conv1"  # the (first) 3x3 convolution
    new: Params = {}
    y = x
    for name in names:
        step = stride if name == strided else 1
        y, new[name] = conv_bn(y, p[name], s[name], step, train, replicas)
        if name != names[-1]:
            y = jax.nn.relu(y)
    shortcut = x
    if "proj" in p:
        shortcut, new["proj"] = conv_bn(x, p["proj"], s["proj"], stride, train, replicas)
    return jax.nn.relu(y + shortcut), new


Remat = bool | Sequence[str]  # every block, or the blocks whose outputs are checkpoints


def forward(
    params: Params,
    bn_state: Params,
    images: jax.Array,
    config: Config,
    train: bool = True,
    remat: Remat = False,
    replicas: int = 1,
) -> tuple[jax.Array, Params]:
    """Logits [batch, classes] for images [batch, H, W, C], and the updated running statistics.
    Images of 8-bit integers (Graphcore's 8-bit host IO) are scaled to [0, 1] on the device.
    Batch norm normalises each of `replicas` shares of the batch by its own statistics
    (`batch_norm`). `remat` says what the backward pass recomputes (`segments`): with True,
    each residual block, from its input; with block names (`block_names`), only those blocks'
    outputs are kept as checkpoints and each run of units between two of them is recomputed
    from the checkpoint before it, as Graphcore's configurations name their recomputation
    checkpoints (`workloads.py`)."""
    x = images.astype(config.dtype)
    if images.dtype == jnp.uint8:
        x = x * jnp.asarray(1 / 255, config.dtype)
    new: dict[str, Params] = {}
    for names, recomputed in segments(config, remat):
        run = functools.partial(_run_units, names, config, train=train, replicas=replicas)
        p, s = [_of(params, n) for n in names], [_of(bn_state, n) for n in names]
        x, updated = (jax.checkpoint(run) if recomputed else run)(x, p, s)
        new.update(zip(names, updated, strict=True))
    with jax.named_scope("head"):
        pooled = jnp.mean(x.astype(wide(x.dtype)), axis=(1, 2)).astype(x.dtype)
        logits = pooled @ params["head"]["w"] + params["head"]["b"]
    names = iter(block_names(config))
    stages = [[new[next(names)] for _ in range(count)] for count in config.blocks]
    return logits, {"stem": new["stem"], "stages": stages}


def segments(config: Config, remat: Remat) -> list[tuple[list[str], bool]]:
    """The units (the stem, then the blocks) in runs, and whether the backward pass recomputes
    each run. Without remat, one run kept whole; with True, the stem kept and each block
    recomputed; with checkpoint names, a run ends at each checkpoint and every run but the last
    is recomputed (the last, which the backward pass reads first, is kept whole)."""
    names = ["stem", *block_names(config)]
    if remat is True:
        return [(["stem"], False), *(([name], True) for name in names[1:])]
    if not remat:
        return [(names, False)]
    unknown = sorted(set(remat) - set(names[1:]))
    if unknown:
        raise ValueError(f"recomputation checkpoints {unknown} are not blocks of this ResNet")
    runs: list[tuple[list[str], bool]] = [([], True)]
    for name in names:
        runs[-1][0].append(name)
        if name in remat and name != names[-1]:
            runs.append(([], True))
    runs[-1] = (runs[-1][0], False)
    return runs


def _position(name: str) -> tuple[int, int]:
    """A block's stage and index, from 0, by its name 'stage{s}/block{b}' (`block_names`)."""
    stage, index = name.removeprefix("stage").split("/block")
    return int(stage) - 1, int(index)


def _of(tree: Params, name: str) -> Params:
    """A unit's parameters (or statistics) by its name: 'stem' or a block's."""
    if name == "stem":
        return tree["stem"]
    stage, index = _position(name)
    return tree["stages"][stage][index]


def _run_units(
    names: list[str],
    config: Config,
    x: jax.Array,
    ps: list[Params],
    ss: list[Params],
    *,
    train: bool,
    replicas: int,
) -> tuple[jax.Array, list[Params]]:
    """The units `names` in order, each under its named scope; their updated statistics."""
    updated = []
    for name, p, s in zip(names, ps, ss, strict=True):
        with jax.named_scope(name):
            if name == "stem":
                x, new = conv_bn(x, p, s, config.stem_stride, train, replicas)
                window, stride = config.pool_window, config.pool_stride
                x = max_pool(jax.nn.relu(x), window, stride, config.pool_padding)
            else:
                x, new = block(x, p, s, _stride(*_position(name)), train, replicas)
        updated.append(new)
    return x, updated


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy of integer labels, in float32; the label's log-probability is
    a masked sum over the classes rather than a gather."""
    log_probs = jax.nn.log_softmax(logits.astype(wide(logits.dtype)), axis=-1)
    hit = labels[:, None] == jnp.arange(logits.shape[-1])
    return -jnp.mean(jnp.sum(jnp.where(hit, log_probs, 0.0), axis=-1))


def loss_fn(
    params: Params,
    bn_state: Params,
    images: jax.Array,
    labels: jax.Array,
    config: Config,
    remat: Remat = False,
    replicas: int = 1,
) -> tuple[jax.Array, Params]:
    """The training loss and the updated running statistics (value_and_grad's aux)."""
    logits, new_state = forward(params, bn_state, images, config, True, remat, replicas)
    with jax.named_scope("loss"):
        return cross_entropy(logits, labels), new_state


# ---- training -----------------------------------------------------------------------------------


def _decay_mask(params: Params) -> Any:
    """Weight decay (and LARS's trust ratio) on kernels only, not on batch norm or biases."""
    return jax.tree.map(lambda x: x.ndim >= 2, params)


DEFAULT_LR = {"sgd": 0.1, "lars": 2.0, "lamb": 0.01}


def make_optimizer(
    name: str = "sgd", lr: float | None = None, weight_decay: float = 1e-4, momentum: float = 0.9
) -> optax.GradientTransformation:
    """SGD with momentum (weight decay added to the gradient, as torch's SGD does), LARS or LAMB,
    at a constant learning rate (`DEFAULT_LR[name]` if none is given)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; use one of {', '.join(OPTIMIZERS)}")
    lr = DEFAULT_LR[name] if lr is None else lr
    if name == "lars":
        return optax.lars(
            lr,
            weight_decay=weight_decay,
            weight_decay_mask=_decay_mask,
            trust_ratio_mask=_decay_mask,
            momentum=momentum,
        )
    if name == "lamb":
        return optax.lamb(lr, weight_decay=weight_decay, mask=_decay_mask)
    return optax.chain(
        optax.add_decayed_weights(weight_decay, _decay_mask), optax.sgd(lr, momentum=momentum)
    )


def init_optimizer(
    optimizer: optax.GradientTransformation, params: Params, dtype: Any = "float32"
) -> Any:
    """The optimizer's state, float32 whatever the parameters' type unless `dtype` says
    otherwise (Graphcore's "16.16" keeps the momentum in float16). The step computes the update
    in float32 and stores the state back in its own type."""
    return optimizer.init(_cast(params, dtype))


def make_train_step(
    optimizer: optax.GradientTransformation,
    config: Config,
    remat: Remat = False,
    replicas: int = 1,
    accumulation: int = 1,
) -> Any:
    """`train_step(params, bn_state, opt_state, images, labels)` -> (params, bn_state,
    opt_state, loss): gradients of the mean cross-entropy, then the optimizer's update in
    float32 (float64 for a float64 model); the new parameters are cast back to `config.dtype`.
    `remat` recomputes each block in the backward pass (see `forward`); `replicas` is how many
    shares of the batch batch norm normalises apart (`batch_norm`). With `accumulation` > 1
    the images are [accumulation, batch, H, W, C] (labels [accumulation, batch]): a scan over
    the micro-batches sums their gradients (in the parameters' type) before one update of
    their mean, as Graphcore's gradient accumulation does."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def gradients(params: Params, bn_state: Params, images: jax.Array, labels: jax.Array):
        if accumulation == 1:
            return grad_fn(params, bn_state, images, labels, config, remat, replicas)

        def micro_batch(carry: Any, batch: tuple[jax.Array, jax.Array]) -> tuple[Any, None]:
            loss, state, grads = carry
            (value, state), more = grad_fn(params, state, *batch, config, remat, replicas)
            return (loss + value, state, jax.tree.map(jnp.add, grads, more)), None

        zero = (jnp.zeros((), jnp.float32), bn_state, jax.tree.map(jnp.zeros_like, params))
        (loss, state, grads), _ = lax.scan(micro_batch, zero, (images, labels))
        return (loss / accumulation, state), jax.tree.map(lambda g: g / accumulation, grads)

    def train_step(
        params: Params, bn_state: Params, opt_state: Any, images: jax.Array, labels: jax.Array
    ) -> tuple[Params, Params, Any, jax.Array]:
        (loss, bn_state), grads = gradients(params, bn_state, images, labels)
        master = _cast(params, wide(config.dtype))
        wide_state = jax.tree.map(
            lambda x: x.astype(jnp.promote_types(x.dtype, wide(config.dtype))), opt_state
        )
        updates, new_state = optimizer.update(_cast(grads, wide(config.dtype)), wide_state, master)
        opt_state = jax.tree.map(lambda new, old: new.astype(old.dtype), new_state, opt_state)
        params = _cast(optax.apply_updates(master, updates), config.dtype)
        return params, bn_state, opt_state, loss

    return train_step

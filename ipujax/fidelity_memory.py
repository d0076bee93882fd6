"""Published Poplar memory figures, and what ipujax's memory model says of the same programs.

The rows of `ipujax.fidelity` of kind "memory": each rebuilds in JAX a program whose memory
Graphcore measured with Poplar and reads the same quantity from its cost report. PopVision's
"total memory excluding gaps" of a tile is its variables (always-live, and not-always-live at
the tile's own peak) plus its code and vertex state; ipujax's seven categories
(`CostReport.memory_categories`, docs/target.md "Code and state by category") sum to the same.

Two sources. Graphcore's auto-pipeliner test recorded a PopVision profile of one Keras `Dense`
layer compiled for an MK2 IPU with Poplar 3.0.0 (the same record as the Dense row's cycles).
Graphcore's TensorFlow fork asserts the total memory (excluding gaps) of small programs compiled
for an MK2 IPU Model of 1,472 tiles in its size tests; those run with `compile_ipu_code = False`,
so Poplar did not compile their exchange and control code to IPU instructions and may have sized
them otherwise than a hardware compile does (docs/target.md, "Checked against measured profiles").
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax

from ipujax.api import jit
from ipujax.errors import HostBoundWarning
from ipujax.report import CostReport
from partitioner import Target, make_mesh

Measured = tuple[float, str]

_F16 = jnp.float16
_KERAS = (
    "graphcore/ipu_tensorflow_addons, keras/experimental/auto_pipeline/utils/pva_utils_test.py "
    "(Model1Dense, Poplar 3.0.0): "
)
_TENSORFLOW = (
    "graphcore/tensorflow (b2127bb), tensorflow/compiler/plugin/poplar/tests/size_speed_tests/"
)
_IPU_MODEL = "an MK2 IPU Model of 1,472 tiles without compiled IPU code"


@dataclass(frozen=True, slots=True)
class PublishedFigure:
    """A published measurement the table compares (memory here, inference throughput in
    `fidelity_inference`): the fields `ipujax.fidelity.Figure` takes, bar its kind."""

    name: str
    published: float
    unit: str
    source: str
    measure: Callable[[], Measured]
    what: str


def _spec(shape: tuple[int, ...], dtype: jnp.dtype = _F16) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def _report(fun: Callable, args: Sequence) -> CostReport:
    """One MK2 IPU's cost report of `fun` (the memory model does not depend on the clock)."""
    mesh = make_mesh((1,), ("ipus",), target=Target.mk2())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostBoundWarning)
        return jit(fun, mesh=mesh).lower(*args).compile(check_memory_fits=False).cost_report()


def total_bytes(report: CostReport) -> int:
    """PopVision's "total memory excluding gaps" summed over an IPU's tiles."""
    return sum(size for _, size in report.memory_categories)


def _split(categories: Sequence[tuple[str, int]]) -> str:
    return ", ".join(f"{name.replace('_', ' ')} {size:,}" for name, size in categories)


def _total(report: CostReport, program: str) -> Measured:
    """The total, and how it divides into categories."""
    return total_bytes(report), f"{program}; ipujax's bytes: {_split(report.memory_categories)}"


# ---- Keras Dense(1024) on [16, 4096] f32 (the auto-pipeliner's PopVision record) -------------


def _dense() -> CostReport:
    x, w = _spec((16, 4096), jnp.float32), _spec((4096, 1024), jnp.float32)
    return _report(lambda x, w, b: x @ w + b, (x, w, _spec((1024,), jnp.float32)))


def _dense_total() -> Measured:
    return _total(_dense(), "`x @ w + b`, x [16, 4096], w [4096, 1024], f32")


def _dense_vertex_code() -> Measured:
    report = _dense()
    code = dict(report.memory_categories)["vertex_code"]
    steps = ", ".join(s.name for s in report.supersteps if s.kind != "host")
    return code, f"the codelets of the layer's steps ({steps}), once per tile that runs each"


# ---- Graphcore's TensorFlow size tests (IPU Model, MK2, 1,472 tiles) -------------------------


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """`reduce_mean(softmax_cross_entropy_with_logits_v2(logits, labels))`."""
    return jnp.mean(-jnp.sum(labels * jax.nn.log_softmax(logits, axis=-1), axis=-1))


def _sgd(loss: Callable) -> Callable:
    """`GradientDescentOptimizer(0.01).minimize(loss)`: the step returns the new weights."""

    def step(params: object, x: jax.Array, labels: jax.Array) -> object:
        grads = jax.grad(loss)(params, x, labels)
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)

    return step


def _mlp_loss(params: list, x: jax.Array, labels: jax.Array) -> jax.Array:
    """matmul_size_test.py's `inference`: three `relu(xw_plus_b)` layers, then the loss."""
    for w, b in params:
        x = jax.nn.relu(x @ w + b)
    return _cross_entropy(x, labels)


def _mlp_args(batch: int) -> tuple:
    inputs = 112 * 112 * 4
    shapes = ((inputs, 32), (32, 64), (64, 64))
    params = [(_spec(shape), _spec(shape[1:])) for shape in shapes]
    return params, _spec((batch, inputs)), _spec((batch, 64))


def _mlp(train: bool) -> Callable[[], Measured]:
    def measure() -> Measured:
        fun = _sgd(_mlp_loss) if train else _mlp_loss
        what = "an SGD step" if train else "the loss"
        return _total(_report(fun, _mlp_args(2)), f"{what}, batch 2, fp16, on {_IPU_MODEL}")

    return measure


def _conv(x: jax.Array, weights: tuple[jax.Array, jax.Array], stride: int) -> jax.Array:
    """`conv2d(x, w, padding='SAME') + b`, NHWC."""
    w, b = weights
    dims = ("NHWC", "HWIO", "NHWC")
    return lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=dims) + b


def _resnet_loss(params: dict, x: jax.Array, labels: jax.Array) -> jax.Array:
    """resnet_size_test.py's `inference`: a 7x7 stride-2 convolution, a 3x3 stride-2 max pool,
    two residual units of two 3x3 64-channel convolutions, a global max pool and a 1,000-way
    `xw_plus_b`; no batch norm."""
    x = jax.nn.relu(_conv(x, params["stem"], 2))
    x = lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
    for unit in range(2):
        inner = jax.nn.relu(_conv(x, params[f"b1/{unit}/1"], 1))
        x = jax.nn.relu(_conv(inner, params[f"b1/{unit}/2"], 1) + x)
    w, b = params["fc1"]
    return _cross_entropy(jnp.max(x, axis=(1, 2)) @ w + b, labels)


def _resnet_args() -> tuple:
    def conv(size: int, ins: int) -> tuple:
        return _spec((size, size, ins, 64)), _spec((64,))

    units = {f"b1/{u}/{c}": conv(3, 64) for u in range(2) for c in (1, 2)}
    params = {"stem": conv(7, 4), **units, "fc1": (_spec((64, 1000)), _spec((1000,)))}
    return params, _spec((1, 224, 224, 4)), _spec((1, 1000))


def _resnet(train: bool) -> Callable[[], Measured]:
    def measure() -> Measured:
        fun = _sgd(_resnet_loss) if train else _resnet_loss
        what = "an SGD step" if train else "the loss"
        program = f"{what}, one 224 x 224 x 4 fp16 image, on {_IPU_MODEL}"
        return _total(_report(fun, _resnet_args()), program)

    return measure


def _serialized(x: jax.Array, y: jax.Array, z: jax.Array) -> jax.Array:
    """matmul_size_test.py's `testSerializedMatmul`: `x + concat(y_i @ z)` over 6 row slices."""
    rows = y.shape[0] // 6
    return x + jnp.concatenate([y[i * rows : (i + 1) * rows] @ z for i in range(6)], axis=0)


def _serialized_fullest_tile() -> Measured:
    args = (_spec((30522, 768)), _spec((30522, 128)), _spec((128, 768)))
    report = _report(_serialized, args)
    (tile,) = report.top_tiles[:1]
    return report.peak_tile_bytes, f"tile {tile.tile}: {_split(tile.categories)}"


MEMORY_FIGURES: tuple[PublishedFigure, ...] = (
    PublishedFigure(
        "Keras Dense 4,096 -> 1,024, fp32, batch 16, MK2: memory excluding gaps",
        32.8 * 1024**2,
        "bytes",
        _KERAS + "'totalMemory' 32.8 MiB, PopVision's memory report, memory excluding gaps",
        _dense_total,
        "the seven memory categories over all tiles",
    ),
    PublishedFigure(
        "Keras Dense 4,096 -> 1,024, fp32, batch 16, MK2: vertex code",
        3.4 * 1024**2,
        "bytes",
        _KERAS + "'vertexCode' 3.4 MiB, the one figure the test asserts (within 10%)",
        _dense_vertex_code,
        "vertex code over all tiles",
    ),
    PublishedFigure(
        "TF MLP 50,176 -> 32 -> 64 -> 64, fp16, batch 2, inference, MK2: memory excluding gaps",
        12181182,
        "bytes",
        _TENSORFLOW + "matmul_size_test.py:95 (testInference, within 1%)",
        _mlp(train=False),
        "the seven memory categories over all tiles",
    ),
    PublishedFigure(
        "TF MLP 50,176 -> 32 -> 64 -> 64, fp16, batch 2, SGD step, MK2: memory excluding gaps",
        16126623,
        "bytes",
        _TENSORFLOW + "matmul_size_test.py:192 (testTrainingBs2, within 1%)",
        _mlp(train=True),
        "the seven memory categories over all tiles",
    ),
    PublishedFigure(
        "TF ResNet stem + two 64-channel units, fp16, 224 x 224, inference, MK2: memory "
        "excluding gaps",
        25260426,
        "bytes",
        _TENSORFLOW + "resnet_size_test.py:155 (Resnet18_No_Batchnorm.testInference, within 10%)",
        _resnet(train=False),
        "the seven memory categories over all tiles",
    ),
    PublishedFigure(
        "TF ResNet stem + two 64-channel units, fp16, 224 x 224, SGD step, MK2: memory "
        "excluding gaps",
        39743117,
        "bytes",
        _TENSORFLOW + "resnet_size_test.py:188 (Resnet18_No_Batchnorm.testTraining, within 10%)",
        _resnet(train=True),
        "the seven memory categories over all tiles",
    ),
    PublishedFigure(
        "TF serialized matmul [30,522, 128] x [128, 768] in 6 slices, plus [30,522, 768], fp16, "
        "MK2: fullest tile",
        86813,
        "bytes",
        _TENSORFLOW + "matmul_size_test.py:242 (testSerializedMatmul's max tile memory, "
        "excluding gaps, within 1%)",
        _serialized_fullest_tile,
        "the fullest tile's bytes",
    ),
)

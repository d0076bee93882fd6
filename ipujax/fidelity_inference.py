"""The fidelity table's inference figures (`ipujax.fidelity.FIGURES`): ResNet-50's forward pass
as Graphcore's PopRT ran it on one IPU, compiled from the project's ResNet example in inference
mode (batch norm from its running statistics, the weights resident), and the images per second
read from its report.

The published table (graphcore/PopRT `examples/resnet50/README.md`) gives images per second at
batch sizes 1 to 96 with synthetic data on the IPU ("IPU synthetic": no host transfers) and with
real data, overlapping IO. The rows here are the synthetic ones, so the figure read is the
device's: batch / one call's device seconds (`CostReport.latency`). The table names no device;
its FP8 rows run only on an IPU21, whose one product is the C600 card, so the rows are costed on
a Bow IPU at the C600's clock, 280 TFLOPS fp16 / (1,472 tiles x 128 FLOP a cycle) = 1.486 GHz
(D; the C600's datasheet figure as quoted in bytedance/ByteMLPerf `byte_mlperf/backends/IPU/
README.md`). At Bow's own 1.85 GHz the same program reads 1.25 times faster.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp

from ipujax.api import jit
from ipujax.errors import HostBoundWarning
from ipujax.fidelity_memory import Measured, PublishedFigure
from ipujax.fidelity_systems import example
from ipujax.report import CostReport
from partitioner import Target, make_mesh

C600_FP16_FLOPS = 280e12  # the C600's fp16 peak, from its datasheet
C600_CLOCK_HZ = C600_FP16_FLOPS / (1472 * 128)  # 1.486 GHz: tiles x AMP FLOP a cycle
_POPRT = (
    "graphcore/PopRT examples/resnet50/README.md (commit 8b4b270), 'If use dummy data and IPU "
    "synthetic is enabled': FP16 ResNet 50"
)


def c600() -> Target:
    """A Bow IPU at the C600 card's clock (the same GC200 chip; docstring above)."""
    return dataclasses.replace(Target.bow(), name="c600", clock_hz=C600_CLOCK_HZ)


def resnet50_inference_report(batch: int, target: Target) -> CostReport:
    """ResNet-50's forward pass on `batch` 8-bit 224 x 224 images on one IPU, fp16, batch norm
    from its running statistics, weights and statistics resident (costed from shapes)."""
    model = example("resnet/model.py")
    config = model.resnet50_config("float16")
    params, stats = jax.eval_shape(lambda: model.init(config, jax.random.key(0)))
    images = jax.ShapeDtypeStruct((batch, config.image_size, config.image_size, 3), jnp.uint8)

    def infer(params: object, stats: object, images: jax.Array) -> jax.Array:
        return model.forward(params, stats, images, config, train=False)[0]

    mesh = make_mesh((1,), ("ipu",), target=target)
    lowered = jit(infer, mesh=mesh, resident_argnums=(0, 1)).lower(params, stats, images)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostBoundWarning)  # the device's figure is read
        return lowered.compile(check_memory_fits=False).cost_report()


def resnet50_inference_figure(batch: int) -> Callable[[], Measured]:
    """Images per second of the device alone (synthetic data: no host transfers)."""

    def figure() -> Measured:
        report = resnet50_inference_report(batch, c600())
        device = report.latency.device_seconds
        split = report.time_split()
        parts = ", ".join(
            f"{name} {split[name] * 1e3:.3f}" for name in ("compute", "copies", "exchange", "sync")
        )
        derivation = (
            f"one call of {batch} images: {device * 1e3:.3f} ms on the device ({parts} ms) at "
            f"{report.clock_hz / 1e9:.3f} GHz; {batch} / {device * 1e3:.3f} ms = "
            f"{batch / device:,.0f} images/s; host transfers ({split['host'] * 1e3:.3f} ms a "
            f"call) left out, as the synthetic run has none; peak tile {report.peak_tile_bytes:,}"
            f" of {report.bytes_per_tile:,} B (fits: {'yes' if report.fits else 'no'})"
        )
        return batch / device, derivation

    return figure


INFERENCE_FIGURES = tuple(
    PublishedFigure(
        f"ResNet-50 inference throughput, fp16, batch {batch}, one IPU (C600, synthetic data)",
        published,
        "images/s",
        f"{_POPRT}, bs{batch}: {published:,} images/s; the IPU is an IPU21 (the table's FP8 "
        "rows), a C600 card at 1.486 GHz (D: 280 TFLOPS / (1,472 x 128))",
        resnet50_inference_figure(batch),
        f"the forward pass of {batch} 8-bit images, weights resident, the device's seconds",
    )
    for batch, published in ((8, 9805), (16, 11825))
)

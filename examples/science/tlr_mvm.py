"""Adaptive optics' real-time control on a virtual IPU: a tile low-rank control matrix resident
on the chip, each frame's wavefront-sensor measurements in, the deformable mirror's commands out.

    python examples/science/tlr_mvm.py                   # MAVIS-sized (4,092 x 19,078), fp32
    python examples/science/tlr_mvm.py --dtype float16 --rank 32
    python examples/science/tlr_mvm.py --actuators 1024 --measurements 4096 --frames 100

The control matrix is synthetic (tlr.py: a smooth kernel between points of the pupil), cut into
tiles and compressed to rank k per tile. Its bases U and V are placed on the IPU once
(`ipujax.jit(..., resident_argnums=(0, 1))`), so a frame sends only its measurements and
receives only its commands. Every frame runs through ipujax.jit and is checked against
jax.jit's commands; the cost of a frame comes from the cost report: its latency (from the host,
on the IPU, back), frames per second, the rate the IPU streams the operator at, and its jitter
(none on the IPU: a BSP program's supersteps are fixed when it is compiled).
    ipujax cost-report examples/science/workloads.py:tlr_mvm costs the same frame, shapes only.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

import ipujax

if (EXAMPLES := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, EXAMPLES)  # examples/, for `shared`: see shared/__init__.py
from shared import load
from shared.flags import UsageError, positive

tlr = load.example("science", "tlr")
runner = load.example("science", "runner")
calls = load.example("science", "calls")

# ipujax's commands against jax.jit's: both sum the same products in f32 (fp16 bases: the
# matvec's partials are f32 on the IPU, so the tolerance is fp16's rounding of the result).
TOLERANCE = {"float32": (1e-4, 1e-4), "float16": (2e-2, 2e-2)}


def build_parser() -> argparse.ArgumentParser:
    made = runner.parser("tlr_mvm.py", __doc__)
    add = made.add_argument
    add("--actuators", type=positive, default=tlr.MAVIS_ACTUATORS, help="rows M (4,092)")
    add("--measurements", type=positive, default=tlr.MAVIS_MEASUREMENTS, help="cols N (19,078)")
    add("--tile", type=positive, default=tlr.TILE, help=f"tile size nb (default {tlr.TILE})")
    add("--rank", type=positive, default=tlr.RANK, help=f"rank k per tile (default {tlr.RANK})")
    add("--dtype", choices=sorted(TOLERANCE), default="float32", help="the bases' type (float32)")
    add("--frames", type=positive, default=10, help="frames to run and check (default 10)")
    add("--seed", type=int, default=0, help="matrix and measurements seed (default 0)")
    return made


def shape_of(args: argparse.Namespace) -> Any:
    try:
        return tlr.Shape(args.actuators, args.measurements, args.tile, args.rank)
    except ValueError as error:
        raise UsageError(str(error)) from None


def operator(shape: Any, dtype: str, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The synthetic matrix's tiles and its bases U and V in `dtype`."""
    tiles = tlr.matrix_tiles(shape, seed)
    u, v = tlr.compress(tiles, shape.rank, seed)
    return tiles, u.astype(dtype), v.astype(dtype)


def measurements(shape: Any, dtype: str, rng: np.random.Generator) -> np.ndarray:
    """A frame's measurements, in their padded buffer."""
    return tlr.padded(rng.standard_normal(shape.cols).astype(dtype), shape)


def run_frames(compiled: Any, u: Any, v: Any, shape: Any, args: argparse.Namespace) -> float:
    """--frames frames of fresh measurements through ipujax and jax.jit; the largest
    difference (CheckError past the tolerance)."""
    rng = np.random.default_rng(args.seed + 1)
    reference = jax.jit(tlr.tlr_mvm)
    rtol, atol = TOLERANCE[args.dtype]
    worst = 0.0
    for _ in range(args.frames):
        x = measurements(shape, args.dtype, rng)
        worst = max(worst, runner.check(compiled(u, v, x), reference(u, v, x), rtol, atol))
    return worst


def compression_error(tiles: np.ndarray, u: Any, v: Any, shape: Any) -> float:
    """|TLR product - dense product| / |dense product| over one frame's commands."""
    x = measurements(shape, "float32", np.random.default_rng(7))
    exact = tlr.dense_product(tiles, x)[: shape.rows]
    ours = jax.jit(tlr.tlr_mvm)(u.astype(np.float32), v.astype(np.float32), x)
    ours = np.asarray(ours, np.float64)[: shape.rows]
    return float(np.linalg.norm(ours - exact) / np.linalg.norm(exact))


def describe(shape: Any, args: argparse.Namespace, error: float, worst: float) -> list[str]:
    itemsize = np.dtype(args.dtype).itemsize
    megabytes, dense = shape.operator_bytes(itemsize) / 1e6, shape.dense_bytes(itemsize) / 1e6
    return [
        f"TLR-MVM: {shape.rows:,} actuators x {shape.cols:,} measurements, tiles of "
        f"{shape.tile}, rank {shape.rank}, {args.dtype}, on one {runner.NAMES[args.target]} IPU",
        f"operator: {shape.mt} x {shape.nt} tiles; U and V {megabytes:.1f} MB resident on chip "
        f"(dense: {dense:.1f} MB); "
        f"compression error {error:.1e} (relative, this synthetic matrix)",
        f"checked: {args.frames} frames equal to jax.jit's commands (max |difference| {worst:.2g})",
    ]


def costs(report: ipujax.CostReport, shape: Any, dtype: str) -> list[str]:
    call = calls.CallCost.of(report)
    operator_bytes = shape.operator_bytes(np.dtype(dtype).itemsize)
    return [
        call.line("frame"),
        f"on the IPU: the operator streamed at {calls.rate(operator_bytes, call.device)}, "
        f"{shape.flops() / call.device / 1e12:.2f} TFLOPS",
        call.jitter_line(),
        *calls.caveats(report),
    ]


def main_args(args: argparse.Namespace) -> int:
    shape = shape_of(args)
    tiles, u, v = operator(shape, args.dtype, args.seed)
    mesh = runner.make_mesh(args, 1, "ipu")
    x = np.zeros(shape.nt * shape.tile, args.dtype)
    with warnings.catch_warnings():
        # A frame's measurements come from the host, whatever the step's share of host time:
        # that is the latency a controller has, and what the cost below reports.
        warnings.simplefilter("ignore", ipujax.HostBoundWarning)
        jitted = ipujax.jit(tlr.tlr_mvm, mesh=mesh, resident_argnums=(0, 1))
        compiled = jitted.lower(u, v, x).compile()
    worst = run_frames(compiled, u, v, shape, args)
    error = compression_error(tiles, u, v, shape)
    report = compiled.cost_report()
    runner.save(args, report)
    print("\n".join(describe(shape, args, error, worst) + costs(report, shape, args.dtype)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return runner.run(main_args, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())

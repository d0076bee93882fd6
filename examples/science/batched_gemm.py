"""A batch of small matrix products on a virtual IPU, as the matricized kernels of seismic
imaging, wireless detection and climate emulation run them: many independent C_b = A_b B_b.

    python examples/science/batched_gemm.py                      # 1,472 products of 64^3, fp32
    python examples/science/batched_gemm.py --dtype float16 --batch 4096 --m 32 --n 32 --k 32
    python examples/science/batched_gemm.py --send-a             # A from the host every call

The batch of operators A stays on the IPU between calls (`resident_argnums=0`; `--send-a`
sends it every call instead), each call sends its B and receives its C. Every call runs through
ipujax.jit and is checked against jax.jit; the cost of a call comes from the cost report: its
latency (from the host, on the IPU, back), calls per second, and the rate of the products on
the IPU against its peak (fp16 products accumulate in fp32, as the AMP does).
    ipujax cost-report examples/science/workloads.py:batched_gemm costs the same call.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import ipujax

if (EXAMPLES := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, EXAMPLES)  # examples/, for `shared`: see shared/__init__.py
from shared import load
from shared.flags import positive

runner = load.example("science", "runner")
calls = load.example("science", "calls")

# ipujax's products against jax.jit's, both accumulated in f32 (the order of a split sum may
# differ): relative to the products' size.
RTOL, ATOL = 1e-4, 1e-4
DTYPES = ("float32", "float16")


def batched_gemm(a: jax.Array, b: jax.Array) -> jax.Array:
    """C_b = A_b B_b for every b: `a` [batch, m, k], `b` [batch, k, n], C in float32."""
    return jnp.einsum("bmk,bkn->bmn", a, b, preferred_element_type=jnp.float32)


def flops(batch: int, m: int, n: int, k: int) -> int:
    return 2 * batch * m * n * k


def build_parser() -> argparse.ArgumentParser:
    made = runner.parser("batched_gemm.py", __doc__)
    add = made.add_argument
    add("--batch", type=positive, default=1472, help="products per call (default 1,472)")
    add("--m", type=positive, default=64, help="rows of each A (default 64)")
    add("--n", type=positive, default=64, help="columns of each B (default 64)")
    add("--k", type=positive, default=64, help="columns of A, rows of B (default 64)")
    add("--dtype", choices=DTYPES, default="float32", help="A's and B's type (float32)")
    add("--send-a", action="store_true", help="send A from the host every call")
    add("--calls", type=positive, default=3, help="calls to run and check (default 3)")
    add("--seed", type=int, default=0, help="operands' seed (default 0)")
    return made


def operands(args: argparse.Namespace, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    a = rng.standard_normal((args.batch, args.m, args.k)).astype(args.dtype)
    b = rng.standard_normal((args.batch, args.k, args.n)).astype(args.dtype)
    return a, b


def compile_call(args: argparse.Namespace, a: np.ndarray, b: np.ndarray) -> Any:
    resident = () if args.send_a else (0,)
    mesh = runner.make_mesh(args, 1, "ipu")
    with warnings.catch_warnings():
        # Each call's B comes from the host: that is the call's cost, reported below.
        warnings.simplefilter("ignore", ipujax.HostBoundWarning)
        jitted = ipujax.jit(batched_gemm, mesh=mesh, resident_argnums=resident)
        return jitted.lower(a, b).compile()


def run_calls(compiled: Any, a: np.ndarray, args: argparse.Namespace) -> float:
    rng = np.random.default_rng(args.seed + 1)
    reference = jax.jit(batched_gemm)
    worst = 0.0
    for _ in range(args.calls):
        _, b = operands(args, rng)
        worst = max(worst, runner.check(compiled(a, b), reference(a, b), RTOL, ATOL))
    return worst


def costs(report: ipujax.CostReport, args: argparse.Namespace) -> list[str]:
    call = calls.CallCost.of(report)
    work = flops(args.batch, args.m, args.n, args.k)
    peak = report.peak_flops_per_cycle * report.tiles_per_ipu * report.clock_hz
    achieved = work / call.device
    return [
        call.line("call"),
        f"on the IPU: {achieved / 1e12:.1f} TFLOPS, {achieved / peak:.0%} of its "
        f"{peak / 1e12:.1f} TFLOPS {args.dtype} peak; with the host, "
        f"{work / call.latency / 1e12:.2f} TFLOPS",
        call.jitter_line(),
        *calls.caveats(report),
    ]


def main_args(args: argparse.Namespace) -> int:
    a, b = operands(args, np.random.default_rng(args.seed))
    compiled = compile_call(args, a, b)
    worst = run_calls(compiled, a, args)
    report = compiled.cost_report()
    runner.save(args, report)
    sent = "A and B sent" if args.send_a else "A resident on chip, B sent"
    print(
        f"batched GEMM: {args.batch:,} products of [{args.m}, {args.k}] x [{args.k}, {args.n}], "
        f"{args.dtype}, on one {runner.NAMES[args.target]} IPU ({sent} each call)"
    )
    print(f"checked: {args.calls} calls equal to jax.jit's products (max |difference| {worst:.2g})")
    print("\n".join(costs(report, args)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return runner.run(main_args, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())

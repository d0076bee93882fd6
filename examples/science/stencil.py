"""The heat equation on a periodic 2-D grid, split over the tiles of several virtual IPUs: an
explicit (forward Euler) five-point stencil, its rows over the IPUs, each step exchanging only
the rows at the edges of each IPU's block (a halo), not the grid.

    python examples/science/stencil.py                       # 1,024^2, 100 steps, 4 Bow IPUs
    python examples/science/stencil.py --ipus 8 --grid 2048 --steps 200
    python examples/science/stencil.py --ipus 1

A call advances the field `--steps` steps in one `lax.fori_loop` (partitioned as a loop: its
body split once) and returns the field, which stays on the IPUs between calls (a step's updated
argument), and the last step's largest change, the only value that goes to the host. The
neighbours are `jnp.roll`s, which ipujax splits with halos (docs/target.md, "Halos across
IPUs"). Every call runs through ipujax.jit and is checked against jax.jit; the cost comes from
the cost report: the time of a step, grid points updated per second, the halo exchanges, and
the same steps on one IPU for the speed-up.
    ipujax cost-report examples/science/workloads.py:heat --mesh x=4 costs the same call.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import ipujax

if (EXAMPLES := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, EXAMPLES)  # examples/, for `shared`: see shared/__init__.py
from shared import load
from shared.flags import UsageError, positive

runner = load.example("science", "runner")
calls = load.example("science", "calls")

AXIS = "x"  # the mesh axis the grid's rows are split over
DIFFUSION = 0.2  # alpha = D dt / dx^2: below 1/4, the explicit scheme is stable
RTOL, ATOL = 1e-5, 1e-6  # ipujax's field against jax.jit's: the same f32 arithmetic


def heat_step(u: jax.Array, alpha: float = DIFFUSION) -> jax.Array:
    """One forward-Euler step of du/dt = D laplacian(u), periodic: u + alpha (the four
    neighbours - 4 u)."""
    neighbours = jnp.roll(u, 1, 0) + jnp.roll(u, -1, 0) + jnp.roll(u, 1, 1) + jnp.roll(u, -1, 1)
    return u + alpha * (neighbours - 4 * u)


def solver(steps: int, alpha: float = DIFFUSION) -> Callable[[jax.Array], tuple[Any, Any]]:
    """`solve(u)`: `steps` steps from `u`; the field after them and the last step's largest
    change (the convergence check a solver sends home)."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")

    def solve(u: jax.Array) -> tuple[jax.Array, jax.Array]:
        before = jax.lax.fori_loop(0, steps - 1, lambda _, u: heat_step(u, alpha), u)
        after = heat_step(before, alpha)
        return after, jnp.max(jnp.abs(after - before))

    return solve


def jit_kwargs(mesh: ipujax.Mesh) -> dict[str, Any]:
    """The grid's rows over every axis of `mesh`, the change replicated."""
    rows = P(tuple(mesh.axis_names))
    return {"mesh": mesh, "in_shardings": rows, "out_shardings": (rows, P())}


def build_parser() -> argparse.ArgumentParser:
    made = runner.parser("stencil.py", __doc__)
    add = made.add_argument
    add("--ipus", type=positive, default=4, help="IPUs the rows split over (default 4)")
    add("--grid", type=positive, default=1024, help="grid points per side (default 1,024)")
    add("--steps", type=positive, default=100, help="steps per call (default 100)")
    add("--calls", type=positive, default=2, help="calls to run and check (default 2)")
    add("--seed", type=int, default=0, help="initial field's seed (default 0)")
    return made


def compile_on(args: argparse.Namespace, ipus: int, u: Any) -> ipujax.Compiled:
    if args.grid < 3 * ipus:
        raise UsageError(f"--grid {args.grid} is too small for {ipus} IPUs: use >= {3 * ipus}")
    mesh = runner.make_mesh(args, ipus, AXIS)
    return ipujax.jit(solver(args.steps), **jit_kwargs(mesh)).lower(u).compile()


def run_calls(compiled: ipujax.Compiled, u: np.ndarray, args: argparse.Namespace) -> float:
    """--calls calls, each from the last one's field, through ipujax and jax.jit."""
    reference = jax.jit(solver(args.steps))
    worst, ours, theirs = 0.0, u, u
    for _ in range(args.calls):
        ours, theirs = compiled(ours), reference(theirs)
        worst = max(worst, runner.check(ours, theirs, RTOL, ATOL))
        ours, theirs = ours[0], theirs[0]
    return worst


def _halo_line(report: ipujax.CostReport, steps: int) -> str:
    """'; per step N halo exchange(s) of B bytes per IPU', or nothing on one IPU."""
    halos = [c for c in report.collectives if c.kind == "halo_exchange"]
    if not halos:
        return ""
    per_step = sum(c.bytes_per_ipu for c in halos) // steps
    return f"; per step {len(halos) / steps:g} halo exchange(s), {per_step:,} B per IPU"


def costs(report: ipujax.CostReport, one: ipujax.CostReport, args: argparse.Namespace) -> list[str]:
    call, alone = calls.CallCost.of(report), calls.CallCost.of(one)
    step, step_alone = call.device / args.steps, alone.device / args.steps
    lines = [
        call.line("call"),
        f"per step on the IPUs: {calls.duration(step)}, {args.grid**2 / step / 1e9:.1f} G points/s"
        + _halo_line(report, args.steps),
    ]
    if args.ipus > 1:
        lines.append(
            f"on one IPU: {calls.duration(step_alone)} per step; {args.ipus} IPUs are "
            f"{step_alone / step:.2f}x as fast"
        )
    return [*lines, call.jitter_line(), *calls.caveats(report)]


def main_args(args: argparse.Namespace) -> int:
    u = np.random.default_rng(args.seed).random((args.grid, args.grid), dtype=np.float32)
    compiled = compile_on(args, args.ipus, u)
    worst = run_calls(compiled, u, args)
    shape = jax.ShapeDtypeStruct(u.shape, u.dtype)
    one = compiled if args.ipus == 1 else compile_on(args, 1, shape)
    report = compiled.cost_report()
    runner.save(args, report)
    print(
        f"heat equation: {args.grid:,} x {args.grid:,} f32 grid, {args.steps} steps a call, "
        f"rows over {args.ipus} {runner.NAMES[args.target]} IPU(s)"
    )
    print(f"checked: {args.calls} calls equal to jax.jit's field (max |difference| {worst:.2g})")
    print("\n".join(costs(report, one.cost_report(), args)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return runner.run(main_args, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())

"""A resident fp32 operator streamed at the rate of the vertex PopLibs would pick, worked out by
hand: the first phase of MAVIS's TLR-MVM, a batch of 150 matvecs [512, 128] x [128] whose V
bases stay on the IPU (`resident_argnums`), on one Bow IPU.

This extends tests/partitioner/test_mac_vertex.py (one resident [16384, 4096] matvec, named
resident, split over K) to a batched matvec with a positional resident argument and no split
of K: each tile's block is a whole dot product, so its cycles are the MAC vertex's alone. The
formulas are PopLibs' estimators in `lib/poplin/PerformanceEstimation.hpp` (graphcore/poplibs
at 7eac0f26), as that file names them: DOT `getDenseDotProductCycles`, WORKER
`getConvPartialHorizontalMacCycleEstimate` (+16 outside the loops, x 6 workers: INNER), OUTER
`getConvPartialHorizontalMacSupervisorOuterLoopCycleEstimate`, ZERO
`estimateZeroSupervisorCycles`. Bow: 1,472 tiles, 6 workers, 64-bit loads (2 floats), 1.85 GHz.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
from helpers import device_steps, spec

import ipujax
from partitioner.tiles.matmul_plan import plan_matmul

BOW = ipujax.Target.bow()
F32 = np.dtype(np.float32)
NT, ROWS, NB = 150, 32 * 16, 128  # MAVIS in tiles of 128, rank 16: 150 columns of tiles


def _phase1(v: jax.Array, x: jax.Array) -> jax.Array:
    """Per column j of tiles, V_j^T x_j: the stacked bases [512, 128] times x's slice; x
    arrives flat, as a frame's measurements do."""
    return jnp.einsum("jrn,jn->jr", v, x.reshape(v.shape[0], v.shape[2]))


def test_phase_one_streams_its_bases_at_the_mac_vertex_rate() -> None:
    # The plan: the 150 matvecs one per group of 9 tiles (1,350 tiles), rows split 9 ways
    # (ceil(512 / 9) = 57 rows a tile), K = 128 whole; on the MAC vertex (a matvec's one
    # output column costs the AMP 16).
    plan = plan_matmul(NT, ROWS, 1, NB, F32, 4, BOW)
    assert (plan.b, plan.m, plan.n, plan.k, plan.vertex) == (NT, 9, 1, 1, "mac")
    mesh = ipujax.make_mesh((1,), ("ipu",), target=BOW)
    v, x = spec((NT, ROWS, NB)), spec((NT * NB,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ipujax.HostBoundWarning)
        compiled = ipujax.jit(_phase1, mesh=mesh, resident_argnums=0).lower(v, x).compile()
    report = compiled.cost_report()
    (matmul,) = device_steps(report)
    # DOT(128 f32): 128 is a multiple of the full 2-float vector: 7 + 128 / 2 = 71.
    # INNER: one field row of 57 outputs cut into 6 pieces, the busiest worker's run
    # ceil(57 / 6) = 10 outputs. WORKER: 16 - 0 retained (f32) + per run 19 + 10 x (7 + 71)
    # = 815, + 16 outside the loops = 831; x 6 workers = 4,986.
    # OUTER: 58 (float) + 6 x 9 (zeroing state restored) + 1 conv group x (23 + 1 input group
    # x (15 + 1 output channel x (10 + 4,986))) = 58 + 54 + 5,034 = 5,146.
    # ZERO: 57 partials, 10 a worker, 5 vectors of 2 floats: (5 + 14 - 9) x 6 = 60.
    # Compute: 5,146 + 60 = 5,206 cycles.
    # Exchange: a tile receives its column's 128 floats of x. x lies linearly (19,200 floats,
    # at least 128 B = 32 floats a tile: tiles 0-599); tile 9, the first of column 1, needs
    # x[128:256] from tiles 4-7 and holds none of it: 512 B -> ceil(512 / 4) + 100 = 228
    # cycles. Sync 90.
    assert (matmul.tiles, matmul.compute_cycles) == (1350, 5206)
    assert (matmul.exchange_cycles, matmul.sync_cycles) == (228, 90)
    # Resident: only x comes from the host (150 x 128 x 4 = 76,800 B) and yv goes back
    # (150 x 512 x 4 = 307,200 B); the 39,321,600 B of V never cross the host link.
    assert report.host_bytes == 76_800 + 307_200
    # The rate: 39,321,600 B x 1.85e9 / 5,206 = 13.97 TB/s in the compute set, against the
    # 1,350 tiles' 64-bit loads, 1,350 x 8 B x 1.85e9 = 19.98 TB/s: a tile's 57 x 128 x 4 B
    # are 3,648 loads in its 5,206 cycles (0.70), the rest the 7 cycles around each 64-load
    # dot product, the busiest worker's 10 of 9.5 outputs and the vertex's overheads.
    bases = NT * ROWS * NB * 4
    assert bases == 39_321_600
    assert round(bases * BOW.clock_hz / matmul.compute_cycles / 1e12, 2) == 13.97
    assert round(1350 * 8 * BOW.clock_hz / 1e12, 2) == 19.98


def test_phase_one_values_are_jax_jit() -> None:
    # The same program at a size that runs: only the cost is the vertex's, the values jax's.
    rng = np.random.default_rng(0)
    v = rng.standard_normal((6, 40, 32)).astype(np.float32)
    x = rng.standard_normal(6 * 32).astype(np.float32)
    mesh = ipujax.make_mesh((1,), ("ipu",), target=BOW.with_tiles(16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ipujax.HostBoundWarning)
        ours = ipujax.jit(_phase1, mesh=mesh, resident_argnums=0)(v, x)
    np.testing.assert_allclose(ours, jax.jit(_phase1)(v, x), rtol=1e-5, atol=1e-5)

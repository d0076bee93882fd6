"""Small all-reduces combined within a phase (`partitioner.phases.combine`): those that can run
at one point of a phase go as one ring; one that needs another's result does not join it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import ipujax

MESH = ipujax.make_mesh((4,), ("dp",), target=ipujax.Target.bow().with_tiles(64))


def _independent(x: jax.Array, w: jax.Array) -> tuple[jax.Array, ...]:
    with jax.named_scope("layer0"):
        h = jnp.tanh(x @ w)
    with jax.named_scope("layer1"):  # three sums over the replicas' rows, none reading another
        return h.sum(), (h * h).sum(), jnp.abs(h).sum()


def _dependent(x: jax.Array, w: jax.Array) -> tuple[jax.Array, ...]:
    with jax.named_scope("layer0"):
        h = jnp.tanh(x @ w)
    with jax.named_scope("layer1"):  # the second sum reads the first's result
        total = h.sum()
        return total, (h * total).sum()


def _args() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 128)).astype(np.float32)
    return x, rng.normal(size=(128, 128)).astype(np.float32) / 8


def _compiled(fun: object, buffer: int) -> ipujax.Compiled:
    jitted = ipujax.jit(
        fun, mesh=MESH, in_shardings=(P("dp"), None), phases="auto", collective_buffer_bytes=buffer
    )
    return jitted.lower(*_args()).compile()


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")
def test_three_scalar_sums_of_a_phase_go_as_one_ring_by_hand() -> None:
    apart = _compiled(_independent, 0).cost_report()
    combined = _compiled(_independent, 10 << 20)
    report = combined.cost_report()
    # Apart: three all-reduces of 4 bytes over the 4 IPUs of a Bow machine, each a ring of
    # 2(n-1) = 6 steps sending ceil(2 x 3 x 4 / 4) = 6 bytes: ceil(6 x 1.85e9 / 53.55e9) = 1
    # cycle, 6 x 3,000 of latency, and the group's sync of 111: 18,112 cycles each.
    assert [(c.buffer_bytes, c.cycles) for c in apart.collectives] == [(4, 18_112)] * 3
    # Combined: one ring over 12 bytes, ceil(2 x 3 x 12 / 4) = 18 bytes, still 1 cycle of
    # bytes: 18,112 cycles for all three, 2 x 18,112 fewer than apart.
    (ring,) = report.collectives
    assert (ring.buffer_bytes, ring.cycles) == (12, 18_112)
    assert "3 all-reduces of a phase combined" in ring.why
    saved = (apart.seconds - report.seconds) * report.clock_hz
    assert round(saved) == 2 * 18_112
    for got, want in zip(combined(*_args()), jax.jit(_independent)(*_args()), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")
def test_a_sum_that_reads_another_is_not_combined_with_it() -> None:
    report = _compiled(_dependent, 10 << 20).cost_report()
    assert [c.buffer_bytes for c in report.collectives] == [4, 4]
    assert not any("combined" in c.why for c in report.collectives)

"""Layers stacked and run by `lax.scan`, their weights kept on the IPUs (resident): on chip whole
without phases, as the same layers written with a Python loop; with phases, in streaming memory,
each trip loading its layer's slice while the trip before it computes (with IO tiles). Derived
by hand on 4 layers of 256 x 256 float32 on 16 tiles (docs/phases.md, "Loops")."""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ipujax

LAYERS, WIDTH, BATCH, TILES = 4, 256, 8, 16
W = WIDTH * WIDTH * 4  # one layer's slice of the stack: 262,144 bytes of f32
X = BATCH * WIDTH * 4  # the batch: 8,192 bytes
CLOCK, RATE, LATENCY = 1_850_000_000, 16_000_000_000, 3000  # docs/target.md


def _block(x: jax.Array, w: jax.Array, scoped: bool) -> jax.Array:
    if not scoped:
        return x + jnp.tanh(x @ w)
    with jax.named_scope("attn"):  # two scopes: the carried x is read and rewritten in two
        h = jnp.tanh(x @ w)
    with jax.named_scope("mlp"):
        return x + h


def scanned(ws: jax.Array, x: jax.Array, scoped: bool = False) -> jax.Array:
    y, _ = jax.lax.scan(lambda h, w: (_block(h, w, scoped), None), x, ws)
    return jnp.sum(y * y)


def looped(ws: jax.Array, x: jax.Array) -> jax.Array:
    for i in range(LAYERS):
        x = _block(x, ws[i], False)
    return jnp.sum(x * x)


def _args() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    ws = (0.05 * rng.standard_normal((LAYERS, WIDTH, WIDTH))).astype(np.float32)
    return ws, rng.standard_normal((BATCH, WIDTH)).astype(np.float32)


def _report(fun, phases=None, resident=(0,), io_tiles=0, **static) -> ipujax.CostReport:
    target = dataclasses.replace(ipujax.Target.bow().with_tiles(TILES), io_tiles=io_tiles)
    mesh = ipujax.make_mesh((1,), ("ipu",), target=target)
    ws, x = _args()
    step = jax.tree_util.Partial(fun, **static) if static else fun
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the host-bound advice, a loop kept in one phase
        compiled = ipujax.jit(step, mesh=mesh, phases=phases, resident_argnums=resident)
        compiled = compiled.lower(ws, x).compile()
        np.testing.assert_allclose(
            np.asarray(compiled(ws, x)), np.asarray(jax.jit(step)(ws, x)), rtol=1e-5
        )
    return compiled.cost_report()


def _move(nbytes: int) -> int:
    return -(-nbytes * CLOCK // RATE)


STACK_PER_TILE = LAYERS * W // TILES  # 65,536 B: the stack spread over the tiles


def test_resident_stacked_weights_are_on_chip_as_the_loops_are() -> None:
    scan, loop = _report(scanned), _report(looped)
    assert scan.peak_tile_bytes >= STACK_PER_TILE  # was 41,740: the stack was not counted
    assert abs(scan.peak_tile_bytes - loop.peak_tile_bytes) <= 0.01 * loop.peak_tile_bytes


def test_weights_sent_each_step_stream_from_the_host_a_slice_per_trip() -> None:
    # Not resident, the host streams each trip's slice: the stack is never on chip whole.
    assert _report(scanned, resident=()).peak_tile_bytes < STACK_PER_TILE


# Phased, the loop's phase loads the batch and the stack, 4 slices of W, one a trip; the
# last phase (the loop's own, when its scopes keep it whole) stores the 4-byte loss.
FIRST = LATENCY + _move(X + W)  # 3,000 + 31,258: the batch and the first slice
LATER = LATENCY + _move(W)  # 3,000 + 30,311: each later slice, a window of its own
STORE = LATENCY + _move(4)  # 3,001: the loss


@pytest.mark.parametrize("scoped", [False, True], ids=["laid-out-inline", "kept-whole"])
def test_a_phased_scan_loads_a_slice_a_trip(scoped: bool) -> None:
    report = _report(scanned, phases="auto", scoped=scoped)
    loop = report.phases[0]
    assert loop.load_bytes == X + LAYERS * W
    streamed = sum(p.stream_cycles for p in report.phases)
    assert streamed == FIRST + (LAYERS - 1) * LATER + STORE == 137_192
    assert all(p.overlapped_cycles == 0 for p in report.phases)  # no IO tiles: all exposed
    assert report.peak_tile_bytes < STACK_PER_TILE  # one slice on chip at a time


def test_io_tiles_hide_each_slice_behind_the_trip_before_it() -> None:
    report = _report(scanned, phases="auto", io_tiles=2)
    loop = report.phases[0]
    per_trip = loop.compute_cycles // LAYERS
    # Nothing computes before the first phase; each later slice hides behind a trip.
    assert loop.overlapped_cycles == (LAYERS - 1) * min(LATER, per_trip)
    assert loop.cycles == loop.compute_cycles + loop.stream_cycles - loop.overlapped_cycles


def test_a_phased_scan_streams_and_costs_as_the_loop_does() -> None:
    scan, loop = _report(scanned, phases="auto"), _report(looped, phases="auto")
    assert scan.streaming_bytes == loop.streaming_bytes
    assert abs(scan.seconds - loop.seconds) <= 0.02 * loop.seconds
    assert abs(scan.peak_tile_bytes - loop.peak_tile_bytes) <= 0.02 * loop.peak_tile_bytes

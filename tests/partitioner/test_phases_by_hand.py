"""A 4-layer model phased by layer, its streaming derived by hand (docs/phases.md): bytes loaded,
stored and gathered per phase, the phase count, and the exposed streaming time; with and without
replicated tensor sharding, gradient accumulation and IO tiles. And a 12-layer MLP trained with
clipped Adam: two phases per layer plus optimizer phases, fitting where phases="auto" fits, with
jax.jit's numbers."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P
from partition_helpers import sgd_step, square_loss

import ipujax

LAYERS, WIDTH, BATCH = 4, 256, 8
NAMES = [f"layer{i}" for i in range(LAYERS)]
W = WIDTH * WIDTH * 4  # one weight: 262,144 bytes of f32
X = BATCH * WIDTH * 4  # the batch: 8,192 bytes
CLOCK, RATE, LATENCY = 1_850_000_000, 16_000_000_000, 3000  # docs/target.md


def accumulated(ws, xs):
    """Gradients of micro-batches summed by a scan, then one update."""

    def body(carry, x):
        loss, grads = jax.value_and_grad(square_loss)(ws, x)
        return (carry[0] + loss, [a + g for a, g in zip(carry[1], grads, strict=True)]), None

    zeros = [jnp.zeros_like(w) for w in ws]
    (loss, grads), _ = jax.lax.scan(body, (0.0, zeros), xs)
    n = xs.shape[0]
    return [w - 0.1 * g / n for w, g in zip(ws, grads, strict=True)], loss / n


def _args():
    rng = np.random.default_rng(0)
    ws = [(0.05 * rng.standard_normal((WIDTH, WIDTH))).astype(np.float32) for _ in range(LAYERS)]
    return ws, rng.standard_normal((BATCH, WIDTH)).astype(np.float32)


def _mesh(io_tiles: int = 0, shape=(1,), names=("ipu",)) -> ipujax.Mesh:
    target = dataclasses.replace(ipujax.Target.bow().with_tiles(16), io_tiles=io_tiles)
    return ipujax.make_mesh(shape, names, target=target)


def _move(nbytes: int) -> int:
    return -(-nbytes * CLOCK // RATE)


def _windows(loads: list[int], stores: list[int]) -> list[int]:
    """The IO window before each phase: its loads and the previous phase's stores at once after
    the latency; after the last phase, its own stores."""
    out = []
    for p, load in enumerate(loads):
        window = LATENCY + max(_move(load), _move(stores[p - 1] if p else 0))
        if p == len(loads) - 1:
            window += LATENCY + _move(stores[p])
        out.append(window)
    return out


def _phased(fun, mesh, *args, **kwargs) -> ipujax.CostReport:
    compiled = ipujax.jit(fun, mesh=mesh, phases=NAMES, **kwargs).lower(*args).compile()
    np.testing.assert_allclose(
        np.asarray(compiled(*args)[1]), np.asarray(jax.jit(fun)(*args)[1]), rtol=1e-5
    )
    return compiled.cost_report()


# Phases: layer0..3 forward, then layer3..0 backward, each update in its layer's backward phase.
NAMED = NAMES + [f"{n} (backward)" for n in reversed(NAMES)]
# Forward phase i loads w_i (layer 0 the batch too); the loss is made, and stored, in layer 3's
# forward phase; backward phase i loads w_i (layer 0 the batch too, for its weight's gradient)
# and stores the updated w_i. The activations between phases fit on chip and stay there.
LOADS = [W + X, W, W, W, W, W, W, W + X]
STORES = [0, 0, 0, 4, W, W, W, W]


def test_by_layer_on_one_ipu() -> None:
    ws, x = _args()
    report = _phased(sgd_step, _mesh(), ws, x)
    phases = report.phases
    assert [p.name for p in phases] == NAMED
    assert [p.load_bytes for p in phases] == LOADS
    assert [p.store_bytes for p in phases] == STORES
    assert all(p.link_bytes == 0 for p in phases)
    assert all(p.kept_bytes > 0 for p in phases[1:])  # activations stay on chip
    windows = _windows(LOADS, STORES)
    assert [p.stream_cycles for p in phases] == windows
    # Without IO tiles every window is exposed: 34,258 + 6 x 33,311 + 67,569 cycles.
    assert windows[0] == 3000 + 31_258 and windows[1] == 3000 + 30_311
    exposed = sum(p.stream_cycles - p.overlapped_cycles for p in phases)
    assert exposed == sum(windows) == 301_693
    assert report.streaming_bytes == sum(LOADS) + sum(STORES)


def test_io_tiles_hide_each_window_behind_the_previous_phase() -> None:
    ws, x = _args()
    report = _phased(sgd_step, _mesh(io_tiles=2), ws, x)
    phases = report.phases
    assert [p.load_bytes for p in phases] == LOADS  # the same bytes move
    for p, phase in enumerate(phases):
        before = phases[p - 1].compute_cycles if p else 0
        assert phase.overlapped_cycles == min(phase.stream_cycles, before)
        assert phase.cycles == phase.compute_cycles + phase.stream_cycles - phase.overlapped_cycles
    assert phases[0].overlapped_cycles == 0  # nothing computes before the first phase


def test_replicated_tensor_sharding_over_two_replicas() -> None:
    """Each replica stores half of every weight and gathers the other half (a ring of 2 sends
    W/2) in each phase that needs it whole; the last phase only updates w_0, on its shard."""
    ws, x = _args()
    mesh = _mesh(shape=(2,), names=("dp",))
    report = _phased(sgd_step, mesh, ws, x, in_shardings=(P(), P("dp")))
    phases = report.phases
    assert [p.load_bytes for p in phases] == [n // 2 for n in LOADS]
    assert [p.store_bytes for p in phases] == [n // 2 for n in STORES]
    assert [p.link_bytes for p in phases] == [W // 2] * 7 + [0]
    assert report.streaming_bytes == 2 * (sum(LOADS) + sum(STORES)) // 2  # both IPUs
    assert report.ipu_link_bytes >= 2 * 7 * (W // 2)
    scattered = [c for c in report.collectives if c.kind == "reduce_scatter"]
    assert len(scattered) == LAYERS  # each gradient reduce-scattered, not all-reduced
    assert all(c.bytes_per_ipu == W // 2 for c in scattered)  # (n-1)/n of W for n = 2


def test_gradient_accumulation_loads_each_weight_once_per_phase() -> None:
    """A scan over two micro-batches runs phase-major, laid out inline: both micro-batches of a
    layer in its phase, so a phase loads its weight once whatever the trips (layer 0's forward
    phase the stacked batch too, 2X). The accumulated gradients stay on chip (they fit); the
    update after the loop runs in each layer's optimizer phase, as PopXL's do, loading and
    storing its weight, but layer 0's, whose backward phase is the loop's last, runs there
    (with the loss's store)."""
    ws, x = _args()
    xs = np.stack([x, x[::-1]])
    report = _phased(accumulated, _mesh(), ws, xs)
    phases = report.phases
    later = [f"layer{i} (optimizer)" for i in range(1, LAYERS)]
    assert [p.name for p in phases] == NAMED + later
    assert [p.load_bytes for p in phases] == [W + 2 * X] + [W] * (len(phases) - 1)
    assert [p.store_bytes for p in phases] == [0] * 7 + [W + 4] + [W] * len(later)


# ---- a 12-layer MLP trained with clipped Adam ----------------------------------------------

LAYERS12, WIDTH12 = 12, 640  # 12 x 1.6 MB of weights, with Adam's moments: 4 x a 16-tile IPU
NAMES12 = [f"layer{i}" for i in range(LAYERS12)]
OPTIMIZER = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))


def mlp12_step(ws, state, x):
    loss, grads = jax.value_and_grad(square_loss)(ws, x)
    updates, state = OPTIMIZER.update(grads, state, ws)
    return optax.apply_updates(ws, updates), state, loss


@pytest.fixture(scope="module")
def mlp12_args():
    rng = np.random.default_rng(1)
    ws = [(0.03 * rng.standard_normal((WIDTH12, WIDTH12))).astype(np.float32) for _ in NAMES12]
    return ws, OPTIMIZER.init(ws), rng.standard_normal((8, WIDTH12)).astype(np.float32)


def test_mlp12_by_layer_fits_like_auto_with_optimizer_phases(mlp12_args) -> None:
    args = mlp12_args
    mesh = _mesh()
    with pytest.raises(ipujax.OutOfMemoryError):  # unphased, it does not fit
        ipujax.jit(mlp12_step, mesh=mesh).lower(*args).compile()
    auto = ipujax.jit(mlp12_step, mesh=mesh, phases="auto").lower(*args).compile()
    named = ipujax.jit(mlp12_step, mesh=mesh, phases=NAMES12).lower(*args).compile()
    assert auto.cost_report().fits and named.cost_report().fits
    names = [p.name for p in named.cost_report().phases]
    # Forward and backward per layer; the global norm makes every update but layer 0's (whose
    # backward phase is the last) wait for an optimizer phase of its own.
    expected = NAMES12 + [f"{n} (backward)" for n in reversed(NAMES12)]
    expected += [f"{n} (optimizer)" for n in NAMES12[1:]]
    assert names == expected
    want = jax.jit(mlp12_step)(*args)
    for got in (named(*args), auto(*args)):
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)

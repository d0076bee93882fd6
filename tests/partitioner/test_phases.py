"""Phased execution: weights in streaming memory, phases by name or automatic, jax.jit's values."""

import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from partition_helpers import sgd_step

import ipujax

LAYERS, WIDTH = 8, 512  # 8 x 1 MiB of f32 weights: more than a 16-tile IPU's 10 MB with grads
NAMES = [f"layer{i}" for i in range(LAYERS)]


def _args():
    rng = np.random.default_rng(0)
    ws = [(0.03 * rng.standard_normal((WIDTH, WIDTH))).astype(np.float32) for _ in range(LAYERS)]
    return ws, rng.standard_normal((8, WIDTH)).astype(np.float32)


def _mesh(io_tiles: int = 0, shape=(1,), names=("ipu",)):
    target = dataclasses.replace(ipujax.Target.bow().with_tiles(16), io_tiles=io_tiles)
    return ipujax.make_mesh(shape, names, target=target)


def _close(got, want):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_unphased_it_does_not_fit_and_the_error_says_phases_would():
    ws, x = _args()
    with pytest.raises(ipujax.OutOfMemoryError) as info:
        ipujax.jit(sgd_step, mesh=_mesh()).lower(ws, x).compile()
    message = str(info.value)
    assert "IPU 0, tile" in message and "638,976" in message
    assert "It would fit in phases: with phases='auto'" in message


@pytest.mark.parametrize("phases", ["auto", NAMES], ids=["auto", "named"])
def test_phased_runs_with_jax_jit_values_and_streams_the_weights(phases):
    ws, x = _args()
    compiled = ipujax.jit(sgd_step, mesh=_mesh(), phases=phases).lower(ws, x).compile()
    _close(compiled(ws, x), jax.jit(sgd_step)(ws, x))
    report = compiled.cost_report()
    assert report.fits and len(report.phases) > 1
    weight_bytes = LAYERS * WIDTH * WIDTH * 4
    assert report.streaming_bytes >= weight_bytes
    assert sum(p.streaming_bytes for p in report.phases) == report.streaming_bytes
    assert max(p.peak_tile_bytes for p in report.phases) == report.peak_tile_bytes
    assert report.total_cycles == sum(s.cycles for s in report.supersteps)


def test_named_phases_follow_the_layers_forward_then_backward():
    """One forward and one backward phase per layer; the backward ops of a scope (jax names
    them transpose(jvp(layerN))) run in that layer's backward phase, last layer first, and
    each update joins its layer's backward phase (it waits for nothing later)."""
    ws, x = _args()
    compiled = ipujax.jit(sgd_step, mesh=_mesh(), phases=NAMES).lower(ws, x).compile()
    names = [p.name for p in compiled.cost_report().phases]
    assert names == NAMES + [f"{n} (backward)" for n in reversed(NAMES)]


def test_io_tiles_hide_streaming_behind_compute():
    ws, x = _args()
    plain = ipujax.jit(sgd_step, mesh=_mesh(), phases=NAMES).lower(ws, x).compile().cost_report()
    overlapped = ipujax.jit(sgd_step, mesh=_mesh(io_tiles=2), phases=NAMES).lower(ws, x).compile()
    report = overlapped.cost_report()
    assert all(p.overlapped_cycles == 0 for p in plain.phases)
    assert any(p.overlapped_cycles > 0 for p in report.phases)
    for p in report.phases:  # a phase's time hides at most its streaming
        assert p.cycles == p.compute_cycles + p.stream_cycles - p.overlapped_cycles
    _close(overlapped(ws, x), jax.jit(sgd_step)(ws, x))


def test_streaming_cost_is_the_io_window_before_each_phase():
    """16 GB/s per IPU each way at once (docs/target.md: the PCIe Gen4 x8 bound) at 1.85 GHz,
    after 3,000 cycles of latency: a phase's loads and the previous phase's stores share the
    window; the last phase's own stores follow it."""
    ws, x = _args()
    report = ipujax.jit(sgd_step, mesh=_mesh(), phases=NAMES).lower(ws, x).compile().cost_report()
    target = ipujax.Target.bow()
    assert (target.streaming_bytes_per_second, target.streaming_latency_cycles) == (16e9, 3000)

    def move(nbytes):
        return -(-nbytes * 1_850_000_000 // 16_000_000_000)

    phases = report.phases
    for p, phase in enumerate(phases):
        before = phases[p - 1].store_bytes if p else 0
        window = 3000 + max(move(phase.load_bytes), move(before))
        if p == len(phases) - 1:
            window += 3000 + move(phase.store_bytes)
        assert phase.stream_cycles == window
        assert phase.overlapped_cycles == 0  # no IO tiles: nothing hides
        assert phase.cycles == phase.compute_cycles + window


def test_replicated_tensor_sharding_gathers_the_rest_over_dp():
    ws, x = _args()
    mesh = _mesh(shape=(2,), names=("dp",))
    jitted = ipujax.jit(sgd_step, mesh=mesh, in_shardings=(P(), P("dp")), phases=NAMES)
    compiled = jitted.lower(ws, x).compile()
    _close(compiled(ws, x), jax.jit(sgd_step)(ws, x))
    report = compiled.cost_report()
    # Each replica streams half of layer 0's weight (and its own half of the batch) and
    # gathers the weight's other half over IPU-Links.
    first = report.phases[0]
    half = WIDTH * WIDTH * 4 // 2
    assert first.link_bytes == half
    assert first.load_bytes == half + 8 * WIDTH * 4 // 2
    # The last backward phase only updates layer 0's weight: its shard, gathering nothing.
    last = report.phases[-1]
    assert last.name == "layer0 (backward)" and last.link_bytes == 0
    assert last.store_bytes == half


def test_running_out_of_streaming_memory_is_as_clear_as_oom():
    ws, x = _args()
    target = dataclasses.replace(ipujax.Target.bow().with_tiles(16), streaming_bytes_per_ipu=10**6)
    mesh = ipujax.make_mesh((1,), ("ipu",), target=target)
    with pytest.raises(ipujax.OutOfMemoryError, match="streaming memory: each IPU needs"):
        ipujax.jit(sgd_step, mesh=mesh, phases="auto").lower(ws, x).compile()

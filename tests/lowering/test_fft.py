"""`jnp.fft` on one IPU: StableHLO's fft gives `jax.jit`'s values (the same XLA FFT runs), and
costs its butterflies at the vector rate over the tiles it is spread on (hand-derived)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from oracle import assert_matches_jit, op_names

import ipujax

SIGNAL = np.random.RandomState(0).normal(size=(6, 16)).astype(np.float32)
COMPLEX = (SIGNAL + 1j * SIGNAL[::-1]).astype(np.complex64)

CASES = {
    "fft": (jnp.fft.fft, COMPLEX),
    "ifft": (jnp.fft.ifft, COMPLEX),
    "rfft": (jnp.fft.rfft, SIGNAL),
    "irfft": (jnp.fft.irfft, COMPLEX),
    "fft2": (jnp.fft.fft2, COMPLEX),
    "rfftn": (jnp.fft.rfftn, SIGNAL),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fft_matches_jit(name: str) -> None:
    fn, x = CASES[name]
    graph = assert_matches_jit(fn, x)
    assert "fft" in op_names(graph)
    np.testing.assert_array_equal(np.asarray(ipujax.jit(fn)(x)), np.asarray(jax.jit(fn)(x)))


@given(rows=st.integers(1, 5), n=st.integers(1, 40), seed=st.integers(0, 100))
def test_real_fft_of_any_length_is_jits(rows: int, n: int, seed: int) -> None:
    x = np.random.RandomState(seed).normal(size=(rows, n)).astype(np.float32)
    np.testing.assert_array_equal(
        np.asarray(ipujax.jit(jnp.fft.rfft)(x)), np.asarray(jax.jit(jnp.fft.rfft)(x))
    )


def _fft_steps(x) -> dict:
    # resident: the signal's host transfer is not what these tests cost
    report = ipujax.jit(jnp.fft.fft, resident_argnums=0).lower(x).compile().cost_report()
    return {s.name: s for s in report.supersteps if s.op == "fft"}


def test_many_transforms_one_to_a_tile_by_hand() -> None:
    """1,472 complex transforms of 64 points on a Bow IPU's 1,472 tiles: one a tile. FLOPs
    5 x 64 x log2(64) = 1,920 a transform; a tile's six workers take 320 each at 2 f32 lanes
    a thread cycle: 160 thread cycles, x 6 = 960 tile cycles. Each tile receives its 64 x 8 =
    512 B: 512 / 4 + 100 = 228 cycles; one sync, 90."""
    x = np.zeros((1472, 64), np.complex64)
    (step,) = _fft_steps(x).values()
    assert step.tiles == 1472
    assert step.flops == 1472 * 1920
    assert (step.compute_cycles, step.exchange_cycles, step.sync_cycles) == (960, 228, 90)


def test_one_long_transform_spreads_over_tiles_by_hand() -> None:
    """One transform of 4,096 points (32 KiB): over 32768 / 128 = 256 tiles (128 B at least on
    each). FLOPs 5 x 4096 x 12 = 245,760, 960 a tile: 160 a worker, 80 thread cycles, x 6 =
    480. Each tile's 128 B: 128 / 4 + 100 = 132 cycles, then the four-step FFT's two
    transposes, 132 cycles and a sync each."""
    steps = _fft_steps(np.zeros((4096,), np.complex64))
    transform, transpose = steps["fft.transform"], steps["fft.transpose"]
    assert transform.tiles == 256 and transform.flops == 245_760
    assert (transform.compute_cycles, transform.exchange_cycles) == (480, 132)
    assert (transpose.compute_cycles, transpose.exchange_cycles) == (0, 264)
    assert transpose.sync_cycles == 180

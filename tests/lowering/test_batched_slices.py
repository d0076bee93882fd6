"""The runtime's dynamic slices under vmap (`lowering.batched_slices`): StableHLO's values (starts
clamped into range) under any nesting of vmaps, batched or not, and a gather or a scatter only
where the starts differ between copies."""

import itertools

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

from lowering.batched_slices import (
    dynamic_slice,
    dynamic_update_slice,
    shard_block,
    shard_slice,
)


def _clamped(starts, shape, sizes):
    """StableHLO's rule: each start clamped to [0, dim - size]."""
    return [int(np.clip(s, 0, d - n)) for s, d, n in zip(starts, shape, sizes, strict=True)]


def _slice_reference(x, starts, sizes):
    at = _clamped(starts, x.shape, sizes)
    return x[tuple(slice(a, a + n) for a, n in zip(at, sizes, strict=True))]


def _update_reference(x, update, starts):
    at = _clamped(starts, x.shape, update.shape)
    out = np.array(x)
    out[tuple(slice(a, a + n) for a, n in zip(at, update.shape, strict=True))] = update
    return out


def _ops(fn, *args) -> str:
    """The StableHLO jax lowers `fn` to, for its op names."""
    return jax.jit(fn).lower(*args).as_text()


def _twice_vmapped(fn, batched: tuple[bool, ...]):
    """`fn` under two nested vmaps (sizes 2 and 3), argument i batched at both when batched[i]."""
    axes = tuple(0 if b else None for b in batched)
    return jax.vmap(jax.vmap(fn, in_axes=axes), in_axes=axes)


def _stack(x, batched: bool):
    """`x` given two leading copy dimensions (2, 3), each copy different, when batched."""
    if not batched:
        return x
    copies = np.arange(6, dtype=x.dtype).reshape(2, 3, *([1] * np.ndim(x)))
    return np.asarray(x)[None, None] + copies * (0 if x.dtype.kind in "iu" else 100)


def _some_batched(count: int) -> list[tuple[bool, ...]]:
    """Every way of batching `count` arguments but none."""
    return [b for b in itertools.product([False, True], repeat=count) if any(b)]


@pytest.mark.parametrize("x_batched, starts_batched", _some_batched(2))
def test_slice_under_two_vmaps_has_clamped_values(x_batched, starts_batched):
    x = np.arange(5 * 6, dtype=np.float32).reshape(5, 6)
    i = np.array([[-3, 0, 2], [4, 9, 1]], np.int32) if starts_batched else np.int32(4)
    xs = _stack(x, x_batched)
    in_axes = (0 if x_batched else None, 0 if starts_batched else None)
    fn = jax.vmap(
        jax.vmap(lambda x, i: dynamic_slice(x, (i, np.int32(1)), (2, 3)), in_axes=in_axes),
        in_axes=in_axes,
    )
    got = np.asarray(jax.jit(fn)(xs, i))
    for a, b in itertools.product(range(2), range(3)):
        xa = xs[a, b] if x_batched else xs
        ia = i[a, b] if starts_batched else i
        np.testing.assert_array_equal(got[a, b], _slice_reference(xa, (ia, 1), (2, 3)))
    text = _ops(fn, xs, i)
    assert ("stablehlo.gather" in text) == starts_batched, text


@pytest.mark.parametrize("batched", _some_batched(3))
def test_update_under_two_vmaps_has_clamped_values(batched):
    x_batched, u_batched, starts_batched = batched
    x = np.zeros((5, 6), np.float32)
    u = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    i = np.array([[-3, 0, 2], [4, 9, 1]], np.int32) if starts_batched else np.int32(9)
    xs, us = _stack(x, x_batched), _stack(u, u_batched)
    in_axes = tuple(0 if b else None for b in batched)
    fn = jax.vmap(
        jax.vmap(lambda x, u, i: dynamic_update_slice(x, u, (i, np.int32(2))), in_axes=in_axes),
        in_axes=in_axes,
    )
    got = np.asarray(jax.jit(fn)(xs, us, i))
    for a, b in itertools.product(range(2), range(3)):
        xa = xs[a, b] if x_batched else xs
        ua = us[a, b] if u_batched else us
        ia = i[a, b] if starts_batched else i
        np.testing.assert_array_equal(got[a, b], _update_reference(xa, ua, (ia, 2)))
    text = _ops(fn, xs, us, i)
    assert ("stablehlo.scatter" in text) == starts_batched, text


def test_a_loop_slicing_by_its_counter_stays_sliced_under_vmap():
    """The runtime's usual case: a loop's trip counter slicing a stacked weight that differs
    between IPUs, and writing a stacked result; two mesh axes' vmaps keep both as slices."""

    def scan(stack):
        def body(i, carry):
            h, out = carry
            h = h + dynamic_slice(stack, (i, np.int32(0)), (1, 4))[0]
            return h, dynamic_update_slice(out, h[None], (i, np.int32(0)))

        return lax.fori_loop(0, 3, body, (np.zeros(4, np.float32), np.zeros((3, 4), np.float32)))

    stacks = np.arange(2 * 2 * 3 * 4, dtype=np.float32).reshape(2, 2, 3, 4)
    fn = jax.vmap(jax.vmap(scan))
    h, out = jax.jit(fn)(stacks)
    np.testing.assert_array_equal(h, stacks.sum(axis=2))
    np.testing.assert_array_equal(out, np.cumsum(stacks, axis=2))
    text = _ops(fn, stacks)
    assert "stablehlo.dynamic_slice" in text and "stablehlo.dynamic_update_slice" in text
    assert "stablehlo.gather" not in text and "stablehlo.scatter" not in text, text


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    data=st.data(),
)
def test_slices_agree_with_stablehlo_rule(shape, data):
    """Property: any shape, sizes, starts (negative and past the end included) and batching,
    against StableHLO's clamped slice and update computed in numpy."""
    sizes = [data.draw(st.integers(1, d)) for d in shape]
    starts = [data.draw(st.integers(-7, 7)) for _ in shape]
    x_batched, u_batched = data.draw(st.booleans()), data.draw(st.booleans())
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    u = -np.arange(1, int(np.prod(sizes)) + 1, dtype=np.float32).reshape(sizes)
    starts32 = tuple(np.int32(s) for s in starts)

    xs, us = _stack(x, x_batched or not u_batched), _stack(u, u_batched)
    sliced = _twice_vmapped(lambda x: dynamic_slice(x, starts32, sizes), (True,))
    stacked = _stack(x, True)
    got = np.asarray(jax.jit(sliced)(stacked))
    updated = _twice_vmapped(
        lambda x, u: dynamic_update_slice(x, u, starts32),
        (x_batched or not u_batched, u_batched),
    )
    got_update = np.asarray(jax.jit(updated)(xs, us))
    for a, b in itertools.product(range(2), range(3)):
        np.testing.assert_array_equal(got[a, b], _slice_reference(stacked[a, b], starts, sizes))
        xa = xs[a, b] if (x_batched or not u_batched) else xs
        ua = us[a, b] if u_batched else us
        np.testing.assert_array_equal(got_update[a, b], _update_reference(xa, ua, starts))


def _shard_reference(x, index: int, dimension: int, count: int):
    size = x.shape[dimension] // count
    return np.take(x, np.arange(index * size, (index + 1) * size), axis=dimension)


@pytest.mark.parametrize("x_batched", [False, True])
@pytest.mark.parametrize("dimension", [0, 1])
@pytest.mark.parametrize("tp_inner", [True, False])
def test_shard_slice_under_the_mesh_vmaps(x_batched, dimension, tp_inner):
    """IPU (i, j) of a 2 x 4 mesh takes block j of 4 over axis "tp"; a value the same on every
    IPU is cut by a reshape (no gather), one that differs per IPU by jax's gather. With "tp"
    the outer vmap, the inner "dp" one passes the slice through."""
    x = np.arange(8 * 12, dtype=np.float32).reshape(8, 12)
    copies = 100 * np.arange(8, dtype=np.float32).reshape(2, 4, 1, 1)
    xs = x[None, None] + copies if x_batched else x
    in_axes = 0 if x_batched else None
    per_ipu = lambda x: shard_slice(x, "tp", dimension, 4)  # noqa: E731
    fed = xs
    if tp_inner:
        inner = jax.vmap(per_ipu, in_axes=in_axes, axis_name="tp", axis_size=4)
        fn = jax.vmap(inner, in_axes=in_axes, axis_name="dp", axis_size=2)
    else:  # the same mesh, "tp" vmapped outside "dp": copies in [tp, dp] order
        inner = jax.vmap(per_ipu, in_axes=in_axes, axis_name="dp", axis_size=2)
        swapped = jax.vmap(inner, in_axes=in_axes, axis_name="tp", axis_size=4)
        fn = lambda x: jax.numpy.swapaxes(swapped(x), 0, 1)  # noqa: E731
        fed = np.swapaxes(xs, 0, 1) if x_batched else xs
    got = np.asarray(jax.jit(fn)(fed))
    assert got.shape[:2] == (2, 4)
    for i, j in itertools.product(range(2), range(4)):
        xij = xs[i, j] if x_batched else xs
        np.testing.assert_array_equal(got[i, j], _shard_reference(xij, j, dimension, 4))
    assert ("stablehlo.gather" in _ops(fn, fed)) == x_batched


def test_shard_block_over_two_axes_takes_the_ipus_block_in_mesh_order():
    """Over ("dp", "tp"), IPU (i, j) of a 2 x 4 mesh takes block 4 i + j of 8."""
    x = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
    per_ipu = lambda x: shard_block(x, ("dp", "tp"), 0, 8)  # noqa: E731
    inner = jax.vmap(per_ipu, in_axes=None, axis_name="tp", axis_size=4)
    got = np.asarray(jax.jit(jax.vmap(inner, in_axes=None, axis_name="dp", axis_size=2))(x))
    for i, j in itertools.product(range(2), range(4)):
        np.testing.assert_array_equal(got[i, j], _shard_reference(x, 4 * i + j, 0, 8))

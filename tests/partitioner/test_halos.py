"""Halos: a split dimension read at an offset (a stencil's shifted slices, a pad, `jnp.roll`, a
write at an offset) exchanges the neighbours' edge rows instead of gathering the tensor; each
IPU computes its own block. Values are `jax.jit`'s, on even and padded (uneven) blocks; what no
halo serves is gathered as before; the exchange's cost is worked out by hand; and the heat
stencil of docs/target.md ("Halos across IPUs") scales."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import ipujax
from lowering import Op
from lowering.mesh_rules import MESH_EVAL_RULES
from partitioner.cost.links import LinkModel
from partitioner.target import Target
from tests.helpers import assert_trees_close, target

Fun = Callable[[jax.Array], jax.Array]


def _ops(ops: tuple[Op, ...], depth: int = 0) -> Iterator[tuple[int, Op]]:
    for op in ops:
        yield depth, op
        for region in op.regions:
            yield from _ops(region.ops, depth + 1)


def _names(compiled: ipujax.Compiled) -> list[str]:
    assert compiled.partitioned is not None
    return [op.name for _, op in _ops(compiled.partitioned.graph.ops)]


ROWS = P("x")


def _run(fun: Fun, rows: int, ipus: int | tuple[int, int], spec: P = ROWS) -> list[str]:
    """`fun` on a [rows, 6] grid split as `spec`: its values checked against `jax.jit`'s and
    nothing gathered whole; the per-IPU program's op names."""
    shape = (ipus,) if isinstance(ipus, int) else ipus
    names = ("x",) if isinstance(ipus, int) else ("x", "y")
    mesh = ipujax.make_mesh(shape, names, target=target(16))
    u = np.random.default_rng(rows).random((rows, 6), dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ipujax.ReplicationWarning)
        warnings.simplefilter("ignore", ipujax.HostBoundWarning)
        compiled = ipujax.jit(fun, mesh=mesh, in_shardings=spec).lower(u).compile()
    assert_trees_close(compiled(u), jax.jit(fun)(u))
    return _names(compiled)


# ---- each op, on even and padded blocks ------------------------------------------------------


def _interior(u: jax.Array) -> jax.Array:
    return u[1:-1] * 2


def _neighbours(u: jax.Array) -> jax.Array:
    return u[2:] + u[:-2]


def _pad_zeros(u: jax.Array) -> jax.Array:
    return jnp.pad(u, ((1, 2), (0, 0))) * 3


def _pad_value(u: jax.Array) -> jax.Array:
    return jnp.pad(u, ((2, 1), (1, 1)), constant_values=5.0)


def _roll_down(u: jax.Array) -> jax.Array:
    return jnp.roll(u, 1, 0) * 2


def _roll_up(u: jax.Array) -> jax.Array:
    return jnp.roll(u, -2, 0) + u


def _set_interior(u: jax.Array) -> jax.Array:
    return u.at[1:-1, 1:-1].set(u[1:-1, 1:-1] * 3)  # a scatter at constant indices


def _update(u: jax.Array) -> jax.Array:
    return jax.lax.dynamic_update_slice(u, u[2:] * 2, (1, 0))


OPS = [_interior, _neighbours, _pad_zeros, _pad_value, _roll_down, _roll_up, _set_interior, _update]
# Those whose blocks need a neighbour's rows whatever the mesh (the others may not: on 2 IPUs,
# u[1:-1] of 32 rows is blocks of 15 from blocks of 16, each within its own block; a write of
# u[1:-1] * 3 into u[1:-1] is each row from itself).
EXCHANGING = {_neighbours, _pad_zeros, _pad_value, _roll_down, _roll_up, _update}


def _on_padded(fun: Fun) -> Fun:
    """`fun` on a grid two rows shorter than the input: 30 rows over 4 IPUs are blocks of 8,
    the last holding 6 and 2 rows of padding (510 over 4: 128 and 126)."""
    return lambda u: fun(u[1:-1] * 1.5)


@pytest.mark.parametrize("fun", OPS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("ipus", [2, 4])
def test_each_op_exchanges_edges_on_even_blocks(fun: Fun, ipus: int) -> None:
    names = _run(fun, 32, ipus)
    assert fun not in EXCHANGING or "halo_exchange" in names
    assert "all_gather" not in names


@pytest.mark.parametrize("fun", OPS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("ipus", [2, 4])
def test_each_op_exchanges_edges_on_padded_blocks(fun: Fun, ipus: int) -> None:
    names = _run(_on_padded(fun), 32, ipus)
    assert fun not in EXCHANGING or "halo_exchange" in names
    assert "all_gather" not in names


@pytest.mark.parametrize("fun", [_interior, _roll_down, _set_interior], ids=lambda f: f.__name__)
def test_510_rows_over_4_ipus(fun: Fun) -> None:
    names = _run(_on_padded(fun), 512, 4)
    assert "all_gather" not in names


def test_two_axes_split_one_dim() -> None:
    # rows split over x then y: the IPUs' order along the dim is x major, y minor, and the
    # exchange passes each IPU's edge on across both axes (round the group for a roll).
    for fun in (_neighbours, _roll_up, _update):
        assert "halo_exchange" in _run(fun, 32, (2, 2), P(("x", "y")))
        assert "halo_exchange" in _run(fun, 48, (2, 3), P(("y", "x")))


def test_a_roll_of_a_dim_split_on_each_axis() -> None:
    # Rows over x, columns over y: each roll exchanges along its own dim's axis.
    def rolls(u: jax.Array) -> jax.Array:
        return jnp.roll(u, 1, 0) + jnp.roll(u, -1, 1)

    names = _run(rolls, 32, (2, 2), P("x", "y"))
    assert names.count("halo_exchange") == 2


def test_a_shift_past_a_neighbour_is_gathered_as_before() -> None:
    # Blocks of 8 rows and a roll by 12: a neighbour's neighbour's rows. No halo: the rows are
    # gathered, and the values stay jax.jit's.
    mesh = ipujax.make_mesh((4,), ("x",), target=target(16))
    u = np.random.default_rng(0).random((32, 6), dtype=np.float32)
    fun = lambda u: jnp.roll(u, 12, 0) * 2  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ipujax.HostBoundWarning)
        compiled = ipujax.jit(fun, mesh=mesh, in_shardings=P("x")).lower(u).compile()
    assert_trees_close(compiled(u), jax.jit(fun)(u))
    names = _names(compiled)
    assert "all_gather" in names and "halo_exchange" not in names


# ---- random offsets, sizes and meshes --------------------------------------------------------

_KINDS = ("slice", "pad", "roll", "set")


def _program(kind: str, a: int, b: int) -> Fun:
    """One op at offsets a, b (small, non-negative) along the split dim, then an elementwise
    op, so the result is computed split."""
    if kind == "slice":
        return lambda u: u[a : u.shape[0] - b] * 2
    if kind == "pad":
        return lambda u: jnp.pad(u, ((a, b), (0, 0)), constant_values=float(a)) * 2
    if kind == "roll":
        return lambda u: jnp.roll(u, a - b, 0) * 2
    return lambda u: u.at[a : u.shape[0] - b].set(u[a + b :] * 2)


@settings(max_examples=20, deadline=None)
@given(
    kind=st.sampled_from(_KINDS),
    a=st.integers(0, 3),
    b=st.integers(0, 3),
    block=st.integers(4, 9),
    cut=st.integers(0, 3),
    mesh=st.sampled_from([(2,), (4,), (2, 2)]),
)
def test_random_offsets_sizes_and_meshes(
    kind: str, a: int, b: int, block: int, cut: int, mesh: tuple[int, ...]
) -> None:
    ipus = math.prod(mesh)
    fun = _program(kind, a, b)
    cutting = lambda u: fun(u[cut:] + 1.0)  # noqa: E731  (cut > 0: padded blocks)
    spec = P("x") if len(mesh) == 1 else P(("x", "y"))
    shape = mesh[0] if len(mesh) == 1 else (mesh[0], mesh[1])
    names = _run(cutting, block * ipus, shape, spec)
    if a + b == 0 and cut == 0:
        assert "halo_exchange" not in names


# ---- the exchange itself ---------------------------------------------------------------------


def test_the_exchange_passes_edges_across_two_axes() -> None:
    rule = MESH_EVAL_RULES["halo_exchange"]
    x = jnp.arange(2 * 3 * 4 * 2, dtype=jnp.float32).reshape(2, 3, 4, 2)  # mesh a=2, b=3
    blocks = np.asarray(x).reshape(6, 4, 2)  # the IPUs in order, a major
    for cyclic in (True, False):

        def exchange(block: jax.Array, cyclic: bool = cyclic) -> jax.Array:
            attrs = {"dimension": 0, "before": 1, "after": 2, "cyclic": cyclic}
            return rule(block, axes=("a", "b"), group_size=6, **attrs)[0]

        made = jax.vmap(jax.vmap(exchange, axis_name="b"), axis_name="a")(x)
        got = np.asarray(made).reshape(6, 7, 2)
        zeros = np.zeros((2, 2), np.float32)
        for i in range(6):
            before = blocks[i - 1][-1:] if cyclic or i > 0 else zeros[:1]
            after = blocks[(i + 1) % 6][:2] if cyclic or i < 5 else zeros
            np.testing.assert_array_equal(got[i], np.concatenate([before, blocks[i], after]))


BOW = Target.bow()


def test_halo_cost_by_hand() -> None:
    # 4 IPUs of a Bow-2000: a group's ring 0-1-3-2 has 2 links each way on its slowest hops
    # (docs/target.md, "How a group's ring uses the links"); a halo sends one way round at
    # once on each side, at half the ring's 2 x 2 x 15.75e9 x 0.85 = 53.55e9: 26.775e9 bytes/s.
    # An f32 block of 128 x 512: a row is 2,048 bytes. One row back, two on: 2,048 and 4,096
    # bytes, at once; the larger sets the time. 4,096 x 1.85e9 / 26.775e9 = 283.01 -> 284
    # cycles, + one latency of 3,000 = 3,284; 6,144 bytes sent per IPU.
    ring = LinkModel.place({"x": 4}, BOW).halo(["x"], 2_048, 4_096)
    assert (ring.bytes_per_ipu, ring.steps, ring.link_cycles) == (6_144, 1, 3_284)
    # The group's sync: 2 x 15e-9 s x (1 + 4 // 4) hops x 1.85e9 = 111 cycles.
    assert ring.sync_cycles == math.ceil(2 * 15e-9 * 2 * 1.85e9)


def test_halo_cost_in_the_report() -> None:
    # A roll down and a roll up by two of a 512 x 512 f32 grid over the 4 IPUs: one exchange
    # with the figures above, its record in the report.
    def rolls(u: jax.Array) -> jax.Array:
        return jnp.roll(u, 1, 0) + jnp.roll(u, -2, 0)

    mesh = ipujax.make_mesh((4,), ("x",))
    u = jax.ShapeDtypeStruct((512, 512), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ipujax.HostBoundWarning)
        report = ipujax.jit(rolls, mesh=mesh, in_shardings=P("x")).lower(u).compile()
    (halo,) = report.cost_report().collectives
    assert (halo.kind, halo.axes, halo.group_size) == ("halo_exchange", ("x",), 4)
    assert halo.bytes_per_ipu == 6_144
    assert halo.cycles == 3_284 + math.ceil(2 * 15e-9 * 2 * 1.85e9)


# ---- the heat stencil: 500 steps of a 512 x 512 grid, rows over 4 IPUs -------------------------

N, STEPS = 512, 500


def _heat(u: jax.Array) -> jax.Array:
    def step(i: jax.Array, u: jax.Array) -> jax.Array:
        laplacian = u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4 * u[1:-1, 1:-1]
        return u.at[1:-1, 1:-1].set(u[1:-1, 1:-1] + 0.1 * laplacian)

    return jax.lax.fori_loop(0, STEPS, step, u)


def _heat_roll(u: jax.Array) -> jax.Array:
    def step(i: jax.Array, u: jax.Array) -> jax.Array:
        rolled = jnp.roll(u, 1, 0) + jnp.roll(u, -1, 0) + jnp.roll(u, 1, 1) + jnp.roll(u, -1, 1)
        return u + 0.1 * (rolled - 4 * u)

    return jax.lax.fori_loop(0, STEPS, step, u)


def _stencil(fun: Fun, ipus: int) -> tuple[ipujax.Compiled, jax.Array]:
    mesh = ipujax.make_mesh((ipus,), ("x",))
    u = np.random.default_rng(0).random((N, N), dtype=np.float32)
    jitted = ipujax.jit(fun, mesh=mesh, in_shardings=P("x"), out_shardings=P("x"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ipujax.ReplicationWarning)
        compiled = jitted.lower(u).compile()
        return compiled, compiled(u)


# (the stencil, the most its 4-IPU step may cost as a fraction of one IPU's): the bounds
# docs/target.md ("Halos across IPUs") derives, each with a little room.
STENCILS = [(_heat_roll, 0.70), (_heat, 0.90)]


@pytest.mark.parametrize(("fun", "bound"), STENCILS, ids=["roll", "slices"])
def test_the_heat_stencil_scales(fun: Fun, bound: float) -> None:
    one, _ = _stencil(fun, 1)
    four, values = _stencil(fun, 4)
    u = np.random.default_rng(0).random((N, N), dtype=np.float32)
    np.testing.assert_allclose(values, jax.jit(fun)(u), rtol=1e-5)
    assert four.partitioned is not None
    loops = [op for depth, op in _ops(four.partitioned.graph.ops) if op.name == "while"]
    (loop,) = loops
    inside = [op.name for _, op in _ops(loop.regions[1].ops)]
    assert "all_gather" not in inside
    assert inside.count("halo_exchange") == 1  # one exchange per step, both ways at once
    a, b = one.cost_report(), four.cost_report()
    assert b.flops <= 0.3 * a.flops
    assert b.seconds <= bound * a.seconds

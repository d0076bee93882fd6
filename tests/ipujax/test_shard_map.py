"""`jax.shard_map`: its body is each IPU's program, its collectives (psum, all_gather,
psum_scatter, ppermute, all_to_all, axis_index) the partitioner's, costed on the links. Values
are jax.jit's on an ipujax mesh, on a jax mesh with Explicit axes and under `jax.set_mesh`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import hypothesis.strategies as st
import jax
import numpy as np
import pytest
import shard_map_child as child
from helpers import run_python
from hypothesis import given, settings
from jax.sharding import PartitionSpec as P

import ipujax
from lowering.errors import UnsupportedFeatureError
from lowering.manual import group_axes, permute_axis

CHILD = Path(__file__).with_name("shard_map_child.py")


@pytest.fixture(scope="module")
def differences() -> dict[str, float]:
    """Each program's largest difference from jax.jit, in a child with four host devices (jax.jit
    needs a device per IPU of the mesh; this process has one)."""
    run = run_python(str(CHILD), XLA_FLAGS="--xla_force_host_platform_device_count=4")
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "case",
    [
        "ipujax mesh",
        "explicit, mesh=",
        "explicit, set_mesh",
        "explicit reshard",
        "2 x 2 collectives",
        "reference interpreter",  # lowering.evaluate of the manual_computation itself
    ],
)
def test_values_are_jax_jits(differences: dict[str, float], case: str) -> None:
    assert differences["devices"] == 4
    assert differences[case] <= 1e-6


def test_the_data_parallel_step_all_reduces_its_gradient_on_the_links() -> None:
    w, x = child.weights()
    mesh = ipujax.make_mesh((4,), ("data",))
    compiled = ipujax.jit(child.data_parallel(), mesh=mesh).lower(w, x).compile()
    # Two, as jax writes the program: the gradient of w, which every IPU holds alike, is
    # summed over the IPUs by jax itself (shard_map's varying types), then by the psum.
    collectives = compiled.cost_report().collectives
    assert [(c.kind, c.axes) for c in collectives] == [("all_reduce", ("data",))] * 2
    for collective in collectives:
        assert collective.bytes_per_ipu == 2 * 3 * w.nbytes // 4  # a ring of 4: 2(n-1)/n
        assert "shard_map" in collective.why


def test_every_collective_is_costed_on_the_links() -> None:
    mesh = ipujax.make_mesh((2, 2), ("x", "y"))
    compiled = ipujax.jit(child.program, mesh=mesh).lower(child.grid()).compile()
    collectives = compiled.cost_report().collectives
    kinds = ["all_gather", "reduce_scatter", "collective_permute", "all_to_all", "all_reduce"]
    assert sorted(c.kind for c in collectives) == sorted([*kinds, "all_reduce"])
    assert all(c.bytes_per_ipu > 0 and c.cycles > 0 for c in collectives)


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")
def test_a_permute_costs_one_step_of_the_links_by_hand() -> None:
    # Each of the 4 IPUs of a Bow machine sends its [256, 256] f32 block (262,144 B) to the
    # next. One direction of the ring's links carries 26.775e9 B/s (docs/target.md, "Halos
    # across IPUs": the same figure its 2,048-byte row takes 142 cycles at): 262,144 x 1.85e9
    # / 26.775e9 = 18,112.9 -> 18,113 cycles, one IPU-Link latency of 3,000, and the group's
    # sync of 111: 21,224 cycles.
    def shift(a: jax.Array) -> jax.Array:
        ring = [(i, (i + 1) % 4) for i in range(4)]
        return jax.shard_map(
            lambda b: jax.lax.ppermute(b, "x", ring), in_specs=P("x"), out_specs=P("x")
        )(a)

    a = np.random.default_rng(1).normal(size=(1024, 256)).astype(np.float32)
    mesh = ipujax.make_mesh((4,), ("x",), target=ipujax.Target.bow())
    compiled = ipujax.jit(shift, mesh=mesh).lower(a).compile()
    np.testing.assert_array_equal(compiled(a), np.roll(a, 256, axis=0))
    (permute,) = compiled.cost_report().collectives
    assert permute.bytes_per_ipu == 262_144
    assert permute.cycles == 18_113 + 3_000 + 111


def test_one_ipu_runs_the_body_without_collectives() -> None:
    w, x = child.weights()
    step = child.data_parallel()
    compiled = ipujax.jit(step, mesh=ipujax.make_mesh((1,), ("data",))).lower(w, x).compile()
    with jax.set_mesh(jax.make_mesh((1,), ("data",), axis_types=(child.AUTO,))):
        want = jax.jit(step)(w, x)
    np.testing.assert_allclose(compiled(w, x), want, rtol=1e-6, atol=1e-6)
    assert compiled.cost_report().collectives == ()


def test_a_shard_map_over_some_axes_is_refused_at_the_users_line() -> None:
    def partly(a: jax.Array) -> jax.Array:
        body = lambda b: jax.lax.psum(b, "x")  # noqa: E731
        return jax.shard_map(body, in_specs=P("x"), out_specs=P(), axis_names={"x"})(a)

    mesh = ipujax.make_mesh((2, 2), ("x", "y"))
    with pytest.raises(ipujax.UnsupportedOpError, match=r"manual over \['x'\] but not over"):
        ipujax.jit(partly, mesh=mesh)(np.ones((4, 4), np.float32))


def test_jax_refusing_a_shard_map_is_a_sharding_error_at_the_users_line() -> None:
    def wrong(a: jax.Array) -> jax.Array:
        body = lambda b: jax.lax.all_gather(b, "x", tiled=True)  # noqa: E731
        return jax.shard_map(body, in_specs=P("x"), out_specs=P())(a)  # not replicated

    line = wrong.__code__.co_firstlineno + 2
    with pytest.raises(ipujax.ShardingError, match=rf"test_shard_map.py:{line}\b.*check_vma"):
        ipujax.jit(wrong, mesh=ipujax.make_mesh((2,), ("x",)))(np.ones((4, 4), np.float32))


# ---- replica groups as mesh axes ---------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=3), st.data())
def test_groups_over_any_axes_in_any_order_name_them(sizes: list[int], data: st.DataObject) -> None:
    names = [f"a{i}" for i in range(len(sizes))]
    chosen = data.draw(st.permutations(range(len(sizes))))[: data.draw(st.integers(0, len(sizes)))]
    ids = np.arange(math.prod(sizes)).reshape(sizes)
    # Groups as jax writes them: the chosen axes last, in the chosen order, major to minor.
    rest = [a for a in range(len(sizes)) if a not in chosen]
    groups = np.transpose(ids, rest + list(chosen)).reshape(
        -1, math.prod([sizes[a] for a in chosen])
    )
    mesh = tuple(zip(names, sizes, strict=True))
    spanned = tuple(names[a] for a in chosen if sizes[a] > 1)
    assert group_axes(groups, mesh) == spanned


def test_groups_that_are_no_product_of_axes_are_refused() -> None:
    mesh = (("x", 2), ("y", 2))
    with pytest.raises(UnsupportedFeatureError, match="not a product of the mesh's axes"):
        group_axes(np.array([[0, 3], [1, 2]]), mesh)


def test_a_permute_along_two_axes_is_refused() -> None:
    mesh = (("x", 2), ("y", 2))
    assert permute_axis(np.array([[0, 1], [1, 0], [2, 3], [3, 2]]), mesh) == (
        ("y",),
        ((0, 1), (1, 0)),
    )
    with pytest.raises(UnsupportedFeatureError, match="more than one of the mesh's axes"):
        permute_axis(np.array([[0, 3], [3, 0], [1, 2], [2, 1]]), mesh)


def test_an_ipujax_mesh_gives_jax_its_abstract_mesh() -> None:
    # jax.shard_map takes a jax mesh alone; an ipujax mesh hands it `abstract_mesh`, and the
    # body runs as each IPU's program with jax.jit's values.
    mesh = ipujax.make_mesh((2, 2), ("dp", "tp"))
    assert mesh.abstract_mesh == jax.sharding.AbstractMesh((2, 2), ("dp", "tp"))

    def summed(over: object):
        body = lambda a: jax.lax.psum(a, "tp")  # noqa: E731
        return lambda x: jax.shard_map(
            body, mesh=over, in_specs=P("dp", "tp"), out_specs=P("dp", None)
        )(x)

    x = np.arange(32.0, dtype=np.float32).reshape(4, 8)
    got = ipujax.jit(summed(mesh.abstract_mesh), mesh=mesh, in_shardings=P("dp", "tp"))(x)
    # jax.jit needs 4 devices for this shard_map; by hand, each row's tp halves summed.
    np.testing.assert_array_equal(np.asarray(got), x[:, :4] + x[:, 4:])

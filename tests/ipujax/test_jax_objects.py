"""jax's own objects where ipujax takes meshes and shardings: a `jax.sharding.Mesh` or
`AbstractMesh` as `mesh=`, `NamedSharding`s in `in_shardings`/`out_shardings`, and ipujax's
errors named as ipujax's."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

import ipujax


def _ffn(x: jax.Array, w: jax.Array) -> jax.Array:
    return jax.numpy.tanh(x @ w)


def _args() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(8, 4)).astype(np.float32), rng.normal(size=(4, 6)).astype(np.float32)


def test_a_jax_mesh_and_named_shardings() -> None:
    mesh = jax.make_mesh((1,), ("dp",))
    x, w = _args()
    jitted = ipujax.jit(_ffn, mesh=mesh, in_shardings=(NamedSharding(mesh, P("dp")), None))
    np.testing.assert_allclose(np.asarray(jitted(x, w)), np.asarray(jax.jit(_ffn)(x, w)))
    compiled = jitted.lower(x, w).compile()
    assert compiled.mesh.axis_names == ("dp",) and compiled.mesh.axis_shapes == (1,)


def test_an_abstract_mesh_of_many_ipus_with_named_shardings() -> None:
    mesh = AbstractMesh((2, 2), ("dp", "tp"))
    x, w = _args()
    specs = (NamedSharding(mesh, P("dp")), NamedSharding(mesh, P(None, "tp")))
    jitted = ipujax.jit(_ffn, mesh=mesh, in_shardings=specs, out_shardings=P("dp", "tp"))
    np.testing.assert_allclose(np.asarray(jitted(x, w)), np.asarray(jax.jit(_ffn)(x, w)), rtol=1e-6)
    compiled = jitted.lower(x, w).compile()
    assert compiled.mesh.ipus == 4 and compiled.mesh.target.name == "bow"
    # The spec each NamedSharding stands for reaches the partitioner: x split over dp.
    assert "x float32[8x4] [{dp}, {}]" in compiled.explain()


def test_something_else_as_a_mesh_is_a_clear_error() -> None:
    with pytest.raises(ipujax.ConfigError, match=r"ipujax.make_mesh"):
        ipujax.jit(_ffn, mesh=(2, 2))


@pytest.mark.parametrize(
    "error", [ipujax.OutOfMemoryError, ipujax.ShardingError, ipujax.UnsupportedOpError]
)
def test_errors_print_as_ipujax_names(error: type) -> None:
    assert error.__module__ == "ipujax"
    assert f"{error.__module__}.{error.__qualname__}" == f"ipujax.{error.__name__}"


def test_cost_and_memory_analysis_in_jax_shapes() -> None:
    x, w = _args()  # [8, 4] @ [4, 6], then tanh
    compiled = ipujax.jit(_ffn).lower(x, w).compile()
    costs = compiled.cost_analysis()
    # The matmul's, and one per element of tanh (also counted a transcendental).
    assert costs["flops"] == 2 * 8 * 4 * 6 + 8 * 6
    assert costs["transcendentals"] == 8 * 6
    assert costs["bytes accessed"] >= (8 * 4 + 4 * 6 + 8 * 6) * 4
    assert costs["seconds"] == compiled.cost_report().seconds
    memory = compiled.memory_analysis()
    assert memory.argument_size_in_bytes == (8 * 4 + 4 * 6) * 4
    assert memory.output_size_in_bytes == 8 * 6 * 4
    assert memory.peak_tile_bytes == compiled.cost_report().peak_tile_bytes
    assert memory.tile_bytes == 638_976 and memory.generated_code_size_in_bytes > 0


def test_shardings_in_jax_shapes_and_per_ipu_analysis() -> None:
    x, w = _args()
    mesh = ipujax.make_mesh((2,), ("dp",))
    compiled = ipujax.jit(_ffn, mesh=mesh, in_shardings=(P("dp"), P())).lower(x, w).compile()
    (xs, ws), kwargs = compiled.input_shardings
    assert kwargs == {} and xs.spec == P("dp", None) and ws.spec == P(None, None)
    assert isinstance(xs, NamedSharding) and dict(xs.mesh.shape) == {"dp": 2}
    assert compiled.output_shardings.spec == P("dp", None)
    # Per IPU, as jax's analyses are per device: half of x, all of w.
    assert compiled.memory_analysis().argument_size_in_bytes == (4 * 4 + 4 * 6) * 4
    assert compiled.cost_analysis()["flops"] == 2 * 4 * 4 * 6 + 4 * 6


def test_eval_shape_and_trace_as_jax_jit() -> None:
    x, w = _args()
    jitted = ipujax.jit(_ffn)
    assert jitted.eval_shape(x, w) == jax.eval_shape(_ffn, x, w)
    assert "tanh" in str(jitted.trace(x, w).jaxpr)


def _noisy(key: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    kept, used = jax.random.split(key)
    return kept, x + jax.random.normal(used, x.shape)


@pytest.mark.parametrize("ipus", [1, 2])
def test_typed_prng_keys_as_arguments_and_results(ipus: int) -> None:
    key = jax.random.key(0)
    x = np.zeros((4, 3), np.float32)
    mesh = ipujax.make_mesh((ipus,), ("dp",))
    got = ipujax.jit(_noisy, mesh=mesh, in_shardings=(None, P("dp")))(key, x)
    want = jax.jit(_noisy)(key, x)
    assert got[0].dtype == want[0].dtype  # a typed key, of the same implementation
    np.testing.assert_array_equal(jax.random.key_data(got[0]), jax.random.key_data(want[0]))
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), rtol=1e-6)


def test_a_key_implementation_built_on_rng_bit_generator_is_a_clear_error() -> None:
    key = jax.random.key(0, impl="rbg")
    where = r"rng_bit_generator` at .*test_jax_objects.py"
    with pytest.raises(ipujax.UnsupportedOpError, match=where):
        ipujax.jit(_noisy)(key, np.zeros((4, 3), np.float32))


def test_with_mesh_runs_calls_that_name_none_on_it() -> None:
    x, w = _args()
    jitted = ipujax.jit(_ffn, in_shardings=(P("dp"), None))
    with ipujax.make_mesh((4,), ("dp",)) as mesh:
        assert jitted.lower(x, w).compile().mesh is mesh
        np.testing.assert_allclose(np.asarray(jitted(x, w)), np.asarray(jax.jit(_ffn)(x, w)))
    # Outside the block, one IPU again, with no axis dp; the call made in the block is not
    # reused.
    with pytest.raises(ipujax.ShardingError, match=r"the mesh \(ipu=1\) does not have"):
        jitted(x, w)


def test_jax_set_mesh_is_honoured() -> None:
    x, w = _args()
    jitted = ipujax.jit(_ffn, in_shardings=(P("dp"), None))
    with jax.sharding.use_abstract_mesh(AbstractMesh((2,), ("dp",))):
        compiled = jitted.lower(x, w).compile()
    assert compiled.mesh.axis_names == ("dp",) and compiled.mesh.ipus == 2


def test_an_explicit_mesh_wins_over_the_context() -> None:
    x, w = _args()
    jitted = ipujax.jit(_ffn, mesh=ipujax.make_mesh((2,), ("dp",)))
    with ipujax.make_mesh((4,), ("dp",)):
        assert jitted.lower(x, w).compile().mesh.ipus == 2


def test_a_spec_that_does_not_divide_is_refused_as_jax_refuses_it() -> None:
    x = np.ones((63, 4), np.float32)
    jitted = ipujax.jit(jax.numpy.tanh, mesh=ipujax.make_mesh((2,), ("dp",)), in_shardings=P("dp"))
    with pytest.raises(ipujax.ShardingError) as error:
        jitted(x)
    message = str(error.value)
    assert "\n" not in message
    assert "dimension 0 of shape (63, 4) (63) over dp=2" in message and "pad it to 64" in message


@pytest.mark.parametrize("auto", [True, False])
def test_a_shard_map_over_a_jax_mesh_gives_jax_jits_values(auto: bool) -> None:
    types = (jax.sharding.AxisType.Auto if auto else jax.sharding.AxisType.Explicit,)
    mesh = jax.make_mesh((1,), ("dp",), axis_types=types)

    def program(x: jax.Array) -> jax.Array:
        body = lambda a: jax.lax.psum(a * 2, "dp")  # noqa: E731
        return jax.shard_map(body, mesh=mesh, in_specs=P("dp"), out_specs=P())(x)

    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    x = jax.device_put(x, NamedSharding(mesh, P("dp")))  # an Explicit mesh types x by it
    with jax.set_mesh(mesh):
        want = jax.jit(program)(x)
    np.testing.assert_array_equal(ipujax.jit(program, mesh=mesh)(x), want)

"""`ipujax.jit` behaves like `jax.jit`: decorators, methods, pytrees, statics, caching, staging,
and the errors of settings the single-IPU runtime does not support yet."""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_trees_close, mesh, spec
from jax.sharding import PartitionSpec as P

import ipujax
import ipujax.tracing

MESH = mesh(16)
HERE = os.path.basename(__file__)


@pytest.fixture
def lowerings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Counts the traces `ipujax.jit` makes (each lowering calls `lowering.lower` once)."""
    calls: list[Any] = []
    original = ipujax.tracing.lower

    def counting(fun: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(fun)
        return original(fun, *args, **kwargs)

    monkeypatch.setattr(ipujax.tracing, "lower", counting)
    return calls


def _affine(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    return x * y + 1.0, x - y


X = jnp.arange(8.0, dtype=jnp.float32)
Y = jnp.linspace(-1.0, 1.0, 8, dtype=jnp.float32)


# ---- forms of jit --------------------------------------------------------------------------


def test_decorator_without_arguments() -> None:
    @ipujax.jit
    def double(x: jax.Array) -> jax.Array:
        return 2.0 * x

    assert isinstance(double, ipujax.Jitted)
    assert double.__name__ == "double"  # wrapped like jax.jit wraps
    assert_trees_close(double(X), jax.jit(lambda x: 2.0 * x)(X))
    # The default mesh is one full Bow IPU.
    report = double.lower(X).compile().cost_report()
    assert (report.target, report.tiles_per_ipu, report.ipus) == ("bow", 1472, 1)


def test_decorator_with_arguments() -> None:
    @ipujax.jit(mesh=MESH)
    def affine(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
        return _affine(x, y)

    assert isinstance(affine, ipujax.Jitted)
    assert affine.__name__ == "affine"
    assert_trees_close(affine(X, Y), jax.jit(_affine)(X, Y))
    assert affine.lower(X, Y).compile().cost_report().tiles_per_ipu == 16


def test_function_form_matches_jax_jit() -> None:
    ours = ipujax.jit(_affine, mesh=MESH)(X, Y)
    expected = jax.jit(_affine)(X, Y)
    assert_trees_close(ours, expected)
    assert isinstance(ours, tuple)
    assert all(isinstance(leaf, jax.Array) for leaf in ours)


@dataclasses.dataclass(frozen=True)
class Scaler:
    """A hashable instance: `jax.jit` takes `self` as static with static_argnums=0."""

    factor: float

    @functools.partial(ipujax.jit, static_argnums=0, mesh=MESH)
    def apply(self, x: jax.Array) -> jax.Array:
        return x * self.factor + 1.0

    @functools.partial(jax.jit, static_argnums=0)
    def reference(self, x: jax.Array) -> jax.Array:
        return x * self.factor + 1.0


def test_method_with_static_self() -> None:
    three, five = Scaler(3.0), Scaler(5.0)
    assert_trees_close(three.apply(X), three.reference(X))
    assert_trees_close(five.apply(X), five.reference(X))
    np.testing.assert_array_equal(np.asarray(three.apply(X)), 3.0 * np.asarray(X) + 1.0)
    # Bound methods lower too, with `self` closed over.
    lowered = three.apply.lower(X)
    assert "multiply" in lowered.as_text()
    assert_trees_close(lowered.compile()(X), three.reference(X))


def test_method_on_class_is_the_jitted_function() -> None:
    assert isinstance(Scaler.apply, ipujax.Jitted)
    assert_trees_close(Scaler.apply(Scaler(2.0), X), Scaler(2.0).reference(X))


# ---- pytrees and keyword arguments ---------------------------------------------------------


def _tree_fun(params: dict, batch: tuple, extra: Any = None) -> dict:
    w, b = params["w"], params["b"]
    x, mask = batch
    out = {"y": x @ w + b, "none": None, "pair": (jnp.sum(mask), [w.T, None])}
    if extra is not None:
        out["extra"] = extra["scale"] * x
    return out


PARAMS = {"w": jnp.arange(12.0).reshape(3, 4) / 10.0, "b": jnp.ones(4), "unused": None}
BATCH = (jnp.arange(6.0).reshape(2, 3), jnp.array([1, 0, 1, 1], jnp.int32))


def test_pytrees_in_and_out_with_none_leaves() -> None:
    ours = ipujax.jit(_tree_fun, mesh=MESH)(PARAMS, BATCH)
    expected = jax.jit(_tree_fun)(PARAMS, BATCH)
    assert ours["none"] is None
    assert ours["pair"][1][1] is None
    assert isinstance(ours["pair"][1], list)
    assert_trees_close(ours, expected)


def test_keyword_arguments() -> None:
    extra = {"scale": jnp.float32(-2.0)}
    jitted = ipujax.jit(_tree_fun, mesh=MESH)
    ours = jitted(PARAMS, batch=BATCH, extra=extra)
    assert_trees_close(ours, jax.jit(_tree_fun)(PARAMS, batch=BATCH, extra=extra))
    np.testing.assert_allclose(ours["extra"], -2.0 * np.asarray(BATCH[0]))


def test_python_scalars_are_dynamic(lowerings: list) -> None:
    jitted = ipujax.jit(lambda x, s: x * s, mesh=MESH)
    np.testing.assert_array_equal(jitted(X, 2.0), 2.0 * np.asarray(X))
    np.testing.assert_array_equal(jitted(X, 3.0), 3.0 * np.asarray(X))  # not a stale constant
    assert len(lowerings) == 1


# ---- static arguments ----------------------------------------------------------------------


def _tile(x: jax.Array, reps: int) -> jax.Array:
    return jnp.tile(x, reps)


def test_static_argnums_changes_output_shape(lowerings: list) -> None:
    jitted = ipujax.jit(_tile, static_argnums=1, mesh=MESH)
    x = jnp.arange(4.0)
    two, three = jitted(x, 2), jitted(x, 3)
    assert two.shape == (8,)
    assert three.shape == (12,)
    assert_trees_close(three, jax.jit(_tile, static_argnums=1)(x, 3))
    assert len(lowerings) == 2
    jitted(x, 2)
    assert len(lowerings) == 2  # cached by the static value
    assert len(jitted._cache) == 2


def test_negative_static_argnums() -> None:
    jitted = ipujax.jit(_tile, static_argnums=-1, mesh=MESH)
    assert jitted(jnp.arange(3.0), 4).shape == (12,)


def test_static_argnames_by_keyword() -> None:
    jitted = ipujax.jit(_tile, static_argnames="reps", mesh=MESH)
    x = jnp.arange(4.0)
    out = jitted(x, reps=5)
    assert out.shape == (20,)
    assert_trees_close(out, jax.jit(_tile, static_argnames="reps")(x, reps=5))
    assert jitted(x, reps=1).shape == (4,)


def test_static_value_in_the_lowered_program() -> None:
    lowered = ipujax.jit(_tile, static_argnums=1, mesh=MESH).lower(spec((4,)), 3)
    assert "float32[12]" in lowered.as_text()
    assert len(lowered.graph.inputs) == 1  # the static argument is not an input
    assert lowered.graph.input_names == ("x",)


def test_static_argnames_passed_positionally() -> None:
    x = jnp.arange(4.0)
    assert jax.jit(_tile, static_argnames="reps")(x, 3).shape == (12,)
    assert ipujax.jit(_tile, static_argnames="reps", mesh=MESH)(x, 3).shape == (12,)


def test_static_argnums_passed_by_keyword() -> None:
    x = jnp.arange(4.0)
    assert jax.jit(_tile, static_argnums=1)(x, reps=3).shape == (12,)
    assert ipujax.jit(_tile, static_argnums=1, mesh=MESH)(x, reps=3).shape == (12,)


# ---- caching -------------------------------------------------------------------------------


def test_cached_by_shapes_and_dtypes(lowerings: list) -> None:
    jitted = ipujax.jit(_affine, mesh=MESH)
    first = jitted(X, Y)
    second = jitted(X + 1.0, Y * 2.0)  # new values, same shapes: no new lowering
    assert len(lowerings) == 1
    assert len(jitted._cache) == 1
    assert_trees_close(second, jax.jit(_affine)(X + 1.0, Y * 2.0))
    assert not np.array_equal(np.asarray(first[0]), np.asarray(second[0]))

    jitted(jnp.ones(5), jnp.ones(5))  # a new shape compiles again
    assert len(lowerings) == 2
    assert len(jitted._cache) == 2

    out = jitted(X.astype(jnp.float16), Y.astype(jnp.float16))  # a new dtype too
    assert out[0].dtype == jnp.float16
    assert len(lowerings) == 3
    assert len(jitted._cache) == 3

    jitted(jnp.ones(5), jnp.zeros(5))
    assert len(lowerings) == 3


def test_new_structure_compiles_again(lowerings: list) -> None:
    jitted = ipujax.jit(lambda t: jax.tree.map(lambda a: a + 1.0, t), mesh=MESH)
    jitted({"a": X})
    jitted({"a": X, "b": Y})
    jitted((X,))
    assert len(lowerings) == 3
    assert_trees_close(jitted({"a": X, "b": Y}), {"a": X + 1.0, "b": Y + 1.0})
    assert len(lowerings) == 3


# ---- stages --------------------------------------------------------------------------------


def test_lower_and_cost_without_data() -> None:
    a, b = spec((32, 64)), spec((64, 16))
    compiled = ipujax.jit(lambda a, b: jnp.tanh(a @ b), mesh=MESH).lower(a, b).compile()
    assert isinstance(compiled, ipujax.Compiled)
    report = compiled.cost_report()
    assert isinstance(report, ipujax.CostReport)
    assert report.total_cycles > 0
    assert report.flops >= 2 * 32 * 64 * 16
    assert {"dot_general", "tanh"} <= {op for op, _ in report.cycles_by_op()}
    # The compiled program runs on data of those shapes afterwards.
    x, w = np.ones((32, 64), np.float32), np.full((64, 16), 0.01, np.float32)
    np.testing.assert_allclose(compiled(x, w), np.tanh(x @ w), rtol=1e-6)


def test_lowered_as_text_names_ops() -> None:
    lowered = ipujax.jit(lambda a, b: (a @ b) + 1.0, mesh=MESH).lower(spec((4, 8)), spec((8, 2)))
    assert isinstance(lowered, ipujax.Lowered)
    text = lowered.as_text()
    assert "dot_general" in text
    assert "add" in text
    assert "float32[4x2]" in text


def test_compiled_as_text_shows_supersteps_and_source() -> None:
    compiled = ipujax.jit(_affine, mesh=MESH).lower(X, Y).compile()
    text = compiled.as_text()
    assert "superstep" in text
    assert HERE in text
    assert "multiply" in text
    assert "16 tiles" in text


def test_step_by_step_runs_every_task() -> None:
    def fun(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = jnp.exp(x) * y
        return h.sum(), h - x

    compiled = ipujax.jit(fun, mesh=MESH).lower(X, Y).compile()
    steps = list(compiled.step_by_step(X, Y))
    assert len(steps) == len(compiled.program.tasks)
    assert [task for task, _ in steps] == list(compiled.program.tasks)
    values: dict = {}
    for task, results in steps:
        assert len(results) == len(task.op.results)
        for value, result in zip(task.op.results, results, strict=True):
            assert tuple(np.shape(result)) == value.shape
            values[value] = result
    final = tuple(values[v] for v in compiled.graph.outputs)
    called = compiled(X, Y)
    assert_trees_close(final, tuple(called), rtol=0, atol=0)
    assert_trees_close(called, jax.jit(fun)(X, Y))


def test_donate_argnums_does_not_change_results() -> None:
    expected = jax.jit(_affine)(X, Y)
    donated = ipujax.jit(_affine, mesh=MESH, donate_argnums=(0,))(jnp.array(X), jnp.array(Y))
    both = ipujax.jit(_affine, mesh=MESH, donate_argnums=(0, 1))(jnp.array(X), jnp.array(Y))
    assert_trees_close(donated, expected)
    assert_trees_close(both, expected)


def test_compiled_rejects_a_new_shape() -> None:
    compiled = ipujax.jit(_affine, mesh=MESH).lower(X, Y).compile()
    with pytest.raises(ipujax.IpujaxError):
        compiled(jnp.ones(3), jnp.ones(3))


# ---- unsupported settings ------------------------------------------------------------------


def test_two_ipus_run_replicated_with_jax_jit_values() -> None:
    # No shardings: both IPUs hold everything and compute the same, so nothing crosses links.
    two = ipujax.make_mesh((2,), ("ipu",), target=ipujax.Target.bow().with_tiles(16))
    compiled = ipujax.jit(_affine, mesh=two).lower(X, Y).compile()
    np.testing.assert_allclose(compiled(X, Y), jax.jit(_affine)(X, Y), rtol=1e-6)
    assert compiled.cost_report().ipus == 2
    assert compiled.cost_report().collectives == ()


def test_a_mesh_larger_than_a_pod256_is_a_config_error() -> None:
    with pytest.raises(ipujax.ConfigError, match="Pod256"):
        ipujax.make_mesh((512,), ("dp",))


def test_unknown_phases_setting_is_a_config_error() -> None:
    with pytest.raises(ipujax.ConfigError, match="named_scope"):
        ipujax.jit(_affine, mesh=MESH, phases=["no_such_scope"])(X, Y)


@pytest.mark.parametrize(
    "phases", ["sometimes", 3, ["layer0", 1], [], ()], ids=["word", "number", "item", "[]", "()"]
)
def test_jit_refuses_a_phases_setting_that_is_not_a_form_it_takes(phases: Any) -> None:
    # Refused by jit itself, before anything is traced, naming the value and the forms.
    with pytest.raises(ipujax.ConfigError, match="is not understood") as info:
        ipujax.jit(_affine, mesh=MESH, phases=phases)
    assert f"phases={phases!r}" in str(info.value)
    assert "None, 'auto' or a non-empty sequence of jax.named_scope names" in str(info.value)


@pytest.mark.parametrize("phases", ["auto", ["layer0"]])
def test_jit_refuses_phases_with_a_pipeline(phases: Any) -> None:
    # Both were taken and the phases silently dropped: a pipelined build has no phases.
    pipeline = ipujax.Pipeline("pp", microbatches=2)
    with pytest.raises(ipujax.ConfigError, match="give phases or pipeline"):
        ipujax.jit(_affine, phases=phases, pipeline=pipeline)


def test_jit_keeps_named_phases_as_a_tuple() -> None:
    jitted = ipujax.jit(_affine, mesh=MESH, phases=["layer0", "layer1"])
    assert jitted._options.build.phases == ("layer0", "layer1")


@pytest.mark.parametrize(("verify", "env", "expected"), [(True, "0", True), (False, "1", False)])
def test_verify_overrides_the_environment(
    monkeypatch: pytest.MonkeyPatch, verify: bool, env: str, expected: bool
) -> None:
    monkeypatch.setenv("IPUJAX_VERIFY", env)
    assert ipujax.jit(_affine, verify=verify)._options.build.verify is expected
    assert ipujax.jit(_affine)._options.build.verify is (env == "1")  # None: the environment's
    compiled = ipujax.jit(_affine, mesh=MESH, verify=True).lower(X, Y).compile()
    np.testing.assert_allclose(compiled(X, Y)[0], jax.jit(_affine)(X, Y)[0], rtol=1e-6)


def test_unknown_mesh_axis_is_a_sharding_error() -> None:
    jitted = ipujax.jit(_affine, mesh=MESH, in_shardings=(P("model"), P()))
    with pytest.raises(ipujax.ShardingError, match="model") as info:
        jitted(X, Y)
    assert isinstance(info.value, ipujax.IpujaxError)
    assert "ipu" in str(info.value)  # names the axes the mesh does have
    with pytest.raises(ipujax.ShardingError, match="data"):
        ipujax.jit(_affine, mesh=MESH, out_shardings=(P(None, ("ipu", "data")), P())).lower(X, Y)


def test_known_mesh_axis_replicates_on_one_ipu() -> None:
    jitted = ipujax.jit(_affine, mesh=MESH, in_shardings=(P("ipu"), P(None)), out_shardings=P())
    assert_trees_close(jitted(X, Y), jax.jit(_affine)(X, Y))


def test_errors_are_ipujax_errors() -> None:
    for error in (
        ipujax.ConfigError,
        ipujax.ShardingError,
        ipujax.OutOfMemoryError,
        ipujax.ReportError,
    ):
        assert issubclass(error, ipujax.IpujaxError)


def test_donated_arguments_are_consumed_as_in_jax() -> None:
    def double(v: jax.Array) -> jax.Array:
        return v * 2

    for jitted in (
        jax.jit(double, donate_argnums=0),
        ipujax.jit(double, mesh=MESH, donate_argnums=0),
    ):
        x = jnp.ones(4, jnp.float32)
        np.testing.assert_array_equal(jitted(x), np.full(4, 2.0, np.float32))
        assert x.is_deleted()  # the buffer went to the output, as jax does on this backend


def test_donate_argnames_consumes_the_named_arguments_as_jax_does() -> None:
    # By name, passed by position or by keyword; the other argument is left alone.
    def step(cache: jax.Array, token: jax.Array) -> jax.Array:
        return cache + token

    for name, jitted in (
        ("jax", jax.jit(step, donate_argnames="cache")),
        ("ipujax", ipujax.jit(step, mesh=MESH, donate_argnames="cache")),
    ):
        for by_keyword in (False, True):
            cache, token = jnp.ones(4, jnp.float32), jnp.ones(4, jnp.float32)
            out = jitted(cache=cache, token=token) if by_keyword else jitted(cache, token)
            np.testing.assert_array_equal(out, np.full(4, 2.0, np.float32))
            assert cache.is_deleted() and not token.is_deleted(), (name, by_keyword)


def test_arguments_of_the_graphs_dtypes_pass_as_they_are_and_weak_types_are_cast() -> None:
    """A jax array already of the input's dtype goes in as it is; a weakly typed one (a Python
    scalar made an array) is cast, as jax.jit casts it, and gives the same numbers."""

    def f(x: jax.Array, y: jax.Array) -> jax.Array:
        return x * y + 1

    x = jnp.arange(4, dtype=jnp.float32)
    weak = jnp.asarray(2.5)
    assert weak.weak_type
    step = ipujax.jit(f)
    np.testing.assert_array_equal(step(x, weak), jax.jit(f)(x, weak))
    np.testing.assert_array_equal(step(x, jnp.float32(2.5)), jax.jit(f)(x, weak))


def _square_sum(b: jax.Array) -> jax.Array:
    return (b**2).sum()


@pytest.mark.parametrize(
    "transform",
    [
        lambda f, x: jax.jit(f)(x),
        lambda f, x: jax.grad(lambda a: f(a))(x),
        lambda f, x: jax.eval_shape(f, x),
        lambda f, x: jax.vmap(f)(x[None]),
    ],
    ids=["jit", "grad", "eval_shape", "vmap"],
)
def test_inside_a_jax_transformation_it_is_a_nested_jit(transform: Any) -> None:
    # Called on jax's tracers, the function is traced into the outer program as a nested
    # jax.jit is (a raw ValueError from jax before), and a warning names this file's line.
    x = jnp.arange(4.0)
    with pytest.warns(ipujax.InsideJaxWarning) as caught:
        got = transform(ipujax.jit(_square_sum), x)
    want = transform(jax.jit(_square_sum), x)
    assert jax.tree.map(lambda a, b: (a.shape, a.dtype) == (b.shape, b.dtype), got, want)
    if not isinstance(want, jax.ShapeDtypeStruct):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert caught[0].filename == __file__


def test_a_call_outside_any_transformation_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ipujax.InsideJaxWarning)
        assert float(ipujax.jit(_square_sum)(jnp.arange(4.0))) == 14.0


def test_a_weak_typed_argument_is_compiled_apart_from_a_strong_one() -> None:
    """jax promotes a weak-typed float32 with a bfloat16 array to bfloat16 and a strong one to
    float32: a call with either after the other gets jax.jit's dtype, not the cached one's."""

    def scale(a: Any, b: Any) -> Any:
        return a * b

    b = jnp.ones(4, jnp.bfloat16)
    strong, weak = jnp.float32(2), jnp.asarray(2.0)
    assert weak.weak_type and not strong.weak_type
    step = ipujax.jit(scale)
    for a in (strong, weak, strong):
        assert step(a, b).dtype == jax.jit(scale)(a, b).dtype

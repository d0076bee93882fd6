"""The IR itself: rule tables, printing, source locations, errors, the verifier, costs, walk."""

import dataclasses
import inspect
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from oracle import assert_matches_jit, op_names, uniform

import lowering

THIS_FILE = os.path.basename(__file__)


@pytest.mark.parametrize("table", ["IMPORT_RULES", "SHAPE_RULES", "EVAL_RULES", "COST_RULES"])
def test_tables_cover_vocabulary_exactly(table):
    rules = getattr(lowering, table)
    assert set(rules) == set(lowering.VOCABULARY)
    assert all(callable(rule) for rule in rules.values())


def test_vocabulary_names_have_no_dialect_prefix():
    assert isinstance(lowering.VOCABULARY, frozenset)
    assert {"add", "dot_general", "erf_inv", "top_k", "while", "case"} <= lowering.VOCABULARY
    assert not any("." in name for name in lowering.VOCABULARY)


def mlp_block(x, w, b):
    return jax.nn.relu(x @ w + b).sum(axis=0)


def test_printing_is_readable_and_stable():
    args = (uniform((2, 3)), uniform((3, 4), seed=1), uniform((4,), seed=2))
    first = str(lowering.lower(mlp_block, *args))
    second = str(lowering.lower(mlp_block, *args))
    assert first == second
    for name in ("dot_general", "add", "maximum", "reduce"):
        assert name in first
    assert first != str(lowering.lower(lambda x, w, b: mlp_block(x, w, b) * 2, *args))


def test_locations_name_this_file_and_line():
    def f(x, y):
        return jnp.dot(x, y)

    dot_line = f.__code__.co_firstlineno + 1
    graph = lowering.lower(f, uniform((2, 3)), uniform((3, 4)))
    assert graph.ops
    for op in graph.ops:
        assert os.path.basename(op.loc.file) == THIS_FILE, (op.name, op.loc)
        assert op.loc.line == dot_line, (op.name, op.loc)


def test_locations_distinguish_lines():
    def f(x):
        y = jnp.sin(x)
        return jnp.cos(y)

    first = f.__code__.co_firstlineno
    lines = {op.name: op.loc.line for op in lowering.lower(f, uniform((3,))).ops}
    assert lines["sine"] == first + 1
    assert lines["cosine"] == first + 2


def test_locations_never_point_into_lowering():
    def f(x):
        return (x * 3.0 + 1.0, jnp.float32(2.0) * x)

    package = os.path.dirname(os.path.abspath(lowering.__file__))
    for op in lowering.walk(lowering.lower(f, uniform((3,)))):
        assert not os.path.abspath(op.loc.file).startswith(package), (op.name, op.loc)


def test_named_scope_reaches_loc_scope():
    def f(x):
        with jax.named_scope("blk"):
            y = jnp.tanh(x) * 3.0
        return y + 1.0

    graph = lowering.lower(f, uniform((3,)))
    scopes = {op.name: op.loc.scope for op in graph.ops}
    assert "blk" in scopes["tanh"]
    assert "blk" in scopes["multiply"]
    assert "blk" not in scopes["add"]


def eigh_program(x):
    return jnp.linalg.eigh(x)


def qr_program(x):
    return jnp.linalg.qr(x)


@pytest.mark.parametrize("program", [eigh_program, qr_program])
def test_lapack_custom_call_is_unsupported(program):
    """On CPU these lower to LAPACK custom_calls ipujax does not run (it runs cholesky, lu and
    triangular solves: tests/lowering/test_linalg.py); the error names the op and the user's
    line."""
    line = program.__code__.co_firstlineno + 1
    with pytest.raises(lowering.UnsupportedOpError) as info:
        lowering.lower(program, uniform((3, 3)))
    assert isinstance(info.value, lowering.IpujaxError)
    assert isinstance(info.value, Exception)
    message = str(info.value)
    assert "custom_call" in message
    assert f"{THIS_FILE}:{line}" in message


def test_verify_accepts_lowered_graphs():
    for fn in (mlp_block, lambda x, w, b: lax.fori_loop(0, 2, lambda i, v: v @ w.T, x @ w)):
        graph = lowering.lower(fn, uniform((2, 3)), uniform((3, 3), seed=1), uniform((3,)))
        assert lowering.verify(graph) is None


def _sin_cos():
    graph = lowering.lower(lambda x: jnp.cos(jnp.sin(x)), uniform((3, 2)))
    (sin,) = [op for op in graph.ops if op.name == "sine"]
    (cos,) = [op for op in graph.ops if op.name == "cosine"]
    return graph, sin, cos


def _with_ops(graph, old, new):
    return dataclasses.replace(graph, ops=tuple(new if op is old else op for op in graph.ops))


def test_verify_rejects_wrong_result_type():
    graph, _, cos = _sin_cos()
    bad_value = dataclasses.replace(cos.results[0], shape=(7,))
    bad = _with_ops(graph, cos, dataclasses.replace(cos, results=(bad_value,)))
    bad = dataclasses.replace(bad, outputs=(bad_value,))  # only the type is wrong now
    with pytest.raises(lowering.VerifyError):
        lowering.verify(bad)


def test_verify_rejects_use_before_definition():
    graph, sin, cos = _sin_cos()
    bad = _with_ops(graph, sin, dataclasses.replace(sin, operands=cos.results))
    with pytest.raises(lowering.VerifyError):
        lowering.verify(bad)
    missing = dataclasses.replace(graph, ops=tuple(op for op in graph.ops if op is not sin))
    with pytest.raises(lowering.VerifyError):
        lowering.verify(missing)


def test_verify_rejects_double_definition():
    graph, sin, _ = _sin_cos()
    doubled = dataclasses.replace(graph, ops=(sin, *graph.ops))
    with pytest.raises(lowering.VerifyError):
        lowering.verify(doubled)


def _only_op(graph, name):
    (op,) = [op for op in lowering.walk(graph) if op.name == name]
    return op


@pytest.mark.parametrize(("m", "k", "n"), [(2, 3, 4), (5, 7, 1), (1, 16, 8)])
def test_dot_general_cost(m, k, n):
    graph = lowering.lower(jnp.matmul, uniform((m, k)), uniform((k, n)))
    cost = lowering.op_cost(_only_op(graph, "dot_general"))
    assert cost.flops == 2 * m * k * n
    assert cost.bytes == 4 * (m * k + k * n + m * n)


def test_batched_dot_general_cost():
    graph = lowering.lower(lambda a, b: a @ b, uniform((3, 2, 5)), uniform((3, 5, 4)))
    assert lowering.op_cost(_only_op(graph, "dot_general")).flops == 2 * 3 * 2 * 5 * 4


@pytest.mark.parametrize(("shape", "dtype"), [((3, 5), np.float32), ((8,), jnp.bfloat16)])
def test_elementwise_add_cost(shape, dtype):
    n = int(np.prod(shape))
    x = uniform(shape, dtype=dtype)
    cost = lowering.op_cost(_only_op(lowering.lower(jnp.add, x, x), "add"))
    assert cost.flops == n
    assert cost.bytes == 3 * np.dtype(dtype).itemsize * n
    assert isinstance(cost.flops, int)
    assert isinstance(cost.bytes, int)


def test_walk_reaches_region_ops():
    def f(x, p):
        y = lax.fori_loop(0, 3, lambda i, v: jnp.sin(v) + i, x)
        return lax.cond(p, jnp.tanh, lambda v: jnp.exp(v) * 2.0, y)

    graph = assert_matches_jit(f, uniform((4,)), np.bool_(False))
    top = {op.name for op in graph.ops}
    assert {"while", "case"} <= top
    assert not {"sine", "tanh", "exponential"} & top
    assert {"sine", "tanh", "exponential"} <= op_names(graph)
    for op in graph.ops:
        if op.name in ("while", "case"):
            assert op.regions and all(isinstance(r, lowering.Graph) for r in op.regions)
    assert sum(1 for _ in lowering.walk(graph)) > len(graph.ops)


@jax.jit
def helper(y):
    return jnp.sin(y) * 2.0


def test_jitted_helper_called_twice():
    def f(x):
        return helper(x) + helper(x * 3.0)

    graph = assert_matches_jit(f, uniform((3, 2)))
    sines = [op for op in lowering.walk(graph) if op.name == "sine"]
    assert len(sines) == 2
    source, first = inspect.getsourcelines(helper)
    helper_line = first + next(i for i, text in enumerate(source) if "jnp.sin" in text)
    assert all(op.loc.line == helper_line for op in sines)


def test_values_and_ops_have_the_documented_shape():
    graph = lowering.lower(lambda x, i: (x[i] * 2.0, i + 1), uniform((4, 3)), np.int32(2))
    assert [(v.shape, v.dtype) for v in graph.inputs] == [((4, 3), np.float32), ((), np.int32)]
    assert [(v.shape, v.dtype) for v in graph.outputs] == [((3,), np.float32), ((), np.int32)]
    for op in lowering.walk(graph):
        assert isinstance(op.operands, tuple)
        assert isinstance(op.results, tuple)
        assert isinstance(op.regions, tuple)
        assert all(isinstance(r.shape, tuple) and isinstance(r.dtype, np.dtype) for r in op.results)


def test_free_values_found_once_are_those_of_the_graph_asked():
    """A graph keeps its captures once found; a graph made from it with other ops finds its own."""
    f32 = np.dtype(np.float32)
    outer, inner, result = (lowering.Value(i, (2,), f32) for i in range(3))
    reads_outer = lowering.Op("add", (inner, outer), (result,))
    graph = lowering.Graph(inputs=(inner,), outputs=(result,), ops=(reads_outer,))
    assert lowering.free_values(graph) == (outer,)
    assert lowering.free_values(graph) == (outer,)  # kept
    alone = lowering.Op("add", (inner, inner), (result,))
    assert lowering.free_values(dataclasses.replace(graph, ops=(alone,))) == ()

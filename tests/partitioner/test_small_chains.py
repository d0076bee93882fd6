"""A normalisation's [C] vectors as Poplar runs them: small views made at each reader
(`lowering.view_copies`), a reduction's epilogue read through a view (`lowering.fusion`) and
small chains joined after grouping (`lowering.small_chains`), each against jax.jit's values.

By hand, for a batch norm over [N, C] halves with float statistics and running statistics:
after the statistics' reductions (one fusion of two results, `lowering.siblings`) every op
works on [C] vectors: the variance, the running mean and variance, the scale `a` and shift
`b`, and their casts to half. They read each other's results, or the mean, so they are one
map expression of several results: one superstep. The normalisation `x * a + b` is a second.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from helpers import assert_trees_close, compile_for
from hypothesis import given, settings
from hypothesis import strategies as st

import lowering
from lowering import Graph, Op, Value
from lowering.small_chains import join_small_chains
from lowering.view_copies import copy_views

C = 64


def _batch_norm(x, scale, bias, run_mean, run_var):
    """flax-style batch norm statistics in float over halves, as examples/resnet writes it."""
    mean = jnp.mean(x, axis=0, dtype=jnp.float32)
    var = jnp.maximum(jnp.mean(jnp.square(x.astype(jnp.float32)), axis=0) - mean**2, 0)
    new_mean = 0.9 * run_mean + 0.1 * mean
    new_var = 0.9 * run_var + 0.1 * var
    a = scale.astype(jnp.float32) * jax.lax.rsqrt(var + 1e-5)
    b = bias.astype(jnp.float32) - mean * a
    y = x * a[None].astype(x.dtype) + b[None].astype(x.dtype)
    return y, new_mean, new_var


def _args(n: int = 32):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, C)).astype(np.float16)
    half = rng.normal(size=C).astype(np.float16)
    stat = rng.random(C).astype(np.float32)
    return x, half, half, stat, stat


def _steps(compiled, size: int) -> list:
    """The supersteps of the ops whose first result has `size` elements."""
    return [
        s
        for t in compiled.program.tasks
        if t.op.results and t.op.results[0].size == size
        for s in t.supersteps
    ]


def test_a_batch_norms_vectors_are_one_superstep() -> None:
    """Variance, running statistics, scale and shift and their casts: one superstep of [C]
    vectors after the statistics (whose own stages end in [C] results too), where op by op
    they were eleven."""
    args = _args()
    compiled = compile_for(_batch_norm, *args)
    stats = [t for t in compiled.program.tasks if any(m.name == "reduce" for m in _members(t))]
    vectors = [
        t
        for t in compiled.program.tasks
        if t.supersteps and t not in stats and t.op.results[0].size == C
    ]
    assert len(vectors) == 1, [t.op.attrs.get("members", t.op.name) for t in vectors]
    (task,) = vectors
    assert len(task.supersteps) == 1
    names = [m.name for m in _members(task)]
    assert names.count("rsqrt") == 1 and names.count("maximum") == 1
    unfused = compile_for(_batch_norm, *args, fuse=False)
    assert len(_steps(unfused, C)) >= 11
    assert_trees_close(compiled(*args), jax.jit(_batch_norm)(*args), rtol=1e-3, atol=1e-3)


def _members(task) -> tuple:
    return lowering.members(task.op)


def test_a_sum_cast_through_a_reshape_is_the_reductions_epilogue() -> None:
    """sum(x) over the batch, reshaped to [1, C] and cast to float: the cast is what the
    reduction does as it writes its output, in the reduction's last stage (no superstep of
    its own)."""

    def f(x):
        return jnp.sum(x, axis=0).reshape(1, C).astype(jnp.float32)

    x = _args()[0]
    compiled = compile_for(f, x)
    (task,) = [t for t in compiled.program.tasks if t.supersteps]
    names = [m.name for m in _members(task)]
    assert names.count("reduce") == 1 and names[-2:] == ["reshape", "convert"]
    assert task.result_layouts[0].shape == (1, C)
    assert_trees_close(compiled(x), jax.jit(f)(x), rtol=1e-3, atol=1e-3)


def test_siblings_reading_one_vector_join_and_give_out_both() -> None:
    """Two chains of [C] vectors that read `m` (one through a reshape) and each other's
    nothing: one map expression of two results."""

    def f(m, u, v):
        first = 0.9 * u + 0.1 * m.reshape(C)
        second = jnp.exp(m) * v
        return first, second

    m = np.linspace(0, 1, C, dtype=np.float32).reshape(1, C)
    u = np.ones(C, np.float32)
    v = np.ones((1, C), np.float32)
    compiled = compile_for(f, m, u, v)
    working = [t for t in compiled.program.tasks if t.supersteps]
    assert len(working) == 1 and len(working[0].op.results) == 2
    assert_trees_close(compiled(m, u, v), jax.jit(f)(m, u, v))


def test_a_chain_read_before_the_later_one_does_not_join() -> None:
    """The earlier chain's result is read (by a reduction) before the later chain: joining
    would move it after its reader, so the two stay apart."""

    def f(m, v):
        first = m * 2.0
        total = jnp.sum(first)
        second = jnp.exp(m) * v + total
        return first, second

    m = np.linspace(0, 1, C, dtype=np.float32)
    compiled = compile_for(f, m, m)
    fused = [t for t in compiled.program.tasks if t.supersteps and t.op.results[0].size == C]
    assert len(fused) == 2
    assert_trees_close(compiled(m, m), jax.jit(f)(m, m))


def _graph(ops: list[Op], inputs: tuple[Value, ...], outputs: tuple[Value, ...]) -> Graph:
    return Graph(inputs=inputs, outputs=outputs, ops=tuple(ops), name="main")


def test_view_copies_make_a_small_view_at_each_reader() -> None:
    """exp(x) viewed as [1, C] and read by two ops: each reads its own copy, made just before
    it; the program computes the same values."""
    x = Value(0, (C,), np.dtype(np.float32))
    e = Value(1, (C,), x.dtype)
    view = Value(2, (1, C), x.dtype)
    a, b = Value(3, (1, C), x.dtype), Value(4, (1, C), x.dtype)
    ops = [
        Op("exponential", (x,), (e,)),
        Op("reshape", (e,), (view,), {"new_sizes": (1, C)}),
        Op("negate", (view,), (a,)),
        Op("abs", (view,), (b,)),
    ]
    copied = copy_views(ops, (a, b), itertools.count(10))
    assert [op.name for op in copied] == ["exponential", "reshape", "negate", "reshape", "abs"]
    assert copied[2].operands == copied[1].results and copied[4].operands == copied[3].results
    graph = _graph(copied, (x,), (a, b))
    xs = np.linspace(-1, 1, C, dtype=np.float32)
    got = lowering.interpret(graph, (xs,))
    want = lowering.interpret(_graph(ops, (x,), (a, b)), (xs,))
    assert_trees_close(list(got), list(want))


def test_join_small_chains_leaves_a_program_without_small_chains() -> None:
    """Nothing of [C] or smaller: the ops come back as they were (the same list)."""
    x = Value(0, (4096,), np.dtype(np.float32))
    y = Value(1, (4096,), x.dtype)
    ops = [Op("exponential", (x,), (y,))]
    assert join_small_chains(ops, (y,), lambda op: (), lambda m, e: m[0]) is ops


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(["exp", "neg", "mean", "view"]), min_size=2, max_size=7))
def test_joined_chains_never_change_a_value(steps) -> None:
    """Random programs of [C] vectors read in every order: the values are jax.jit's."""

    def f(x, y):
        outs = [x, y]
        for i, step in enumerate(steps):
            src = outs[i % len(outs)]
            if step == "exp":
                outs.append(jnp.exp(src) * y)
            elif step == "neg":
                outs.append(-src + outs[-1])
            elif step == "mean":
                outs.append(src - jnp.mean(src))
            else:
                outs.append(src.reshape(1, C)[0] * 0.5)
        return tuple(outs[2:])

    x = np.linspace(-1, 1, C, dtype=np.float32)
    y = np.linspace(1, 2, C, dtype=np.float32)
    assert_trees_close(compile_for(f, x, y)(x, y), jax.jit(f)(x, y), rtol=1e-5, atol=1e-5)


def _waiting_view_program(view_line: int) -> Graph:
    """exp(x), its broadcast into [4, C] (read last), then exp(x) + x: the broadcast stands
    between the two chains, in source line `view_line` (the chains are line 1)."""
    f32 = np.dtype(np.float32)
    x, y = Value(0, (C,), f32), Value(1, (4, C), f32)
    a, v, t, w = (
        Value(2, (C,), f32),
        Value(3, (4, C), f32),
        Value(4, (C,), f32),
        Value(5, (4, C), f32),
    )
    one, other = lowering.SourceLoc("f.py", 1), lowering.SourceLoc("f.py", view_line)
    spread = {"shape": (4, C), "broadcast_dimensions": (1,)}
    ops = [
        Op("exponential", (x,), (a,), {}, (), one),
        Op("broadcast_in_dim", (a,), (v,), spread, (), other),
        Op("add", (a, x), (t,), {}, (), one),
        Op("multiply", (v, y), (w,), {}, (), other),
    ]
    return _graph(ops, (x, y), (t, w))


def test_a_view_between_two_chains_waits_behind_them_within_one_key() -> None:
    """The broadcast moves after the joined chain (exp and add, one fusion of two results);
    in a phased build, where a fusion stays within one line, a broadcast of another line stays
    where jax wrote it and the chains stay apart. The values never change."""
    xs = np.linspace(-1, 1, C, dtype=np.float32)
    ys = np.ones((4, C), np.float32)
    for line, phased, joined in ((1, False, True), (2, False, True), (2, True, False)):
        graph = _waiting_view_program(line)
        fused = lowering.fuse_elementwise(graph, by_source=phased)
        chains = [op for op in fused.ops if op.name in ("fusion", "exponential", "add")]
        assert len(chains) == (1 if joined else 2), (line, phased)
        got = lowering.interpret(fused, (xs, ys))
        assert_trees_close(list(got), list(lowering.interpret(graph, (xs, ys))))

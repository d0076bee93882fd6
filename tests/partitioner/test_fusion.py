"""Elementwise fusion (`lowering.fusion`): chains run as one map expression per tile, the values
are jax.jit's, and a fused chain's cycles are derived here by hand.

The cost model (`partitioner.cost.fused`, docs/target.md "Fused elementwise chains"): per
worker, BinaryOp1D's fixed 29 cycles (26 without float work), then per element the larger of
the members' arithmetic (their PopLibs rates: a half add or multiply 1 cycle per 4, a half
maximum 4 per 4, a cast of a half to a float 1 per 2) and the memory instructions (8 bytes
loaded or stored a cycle); six workers in a barrel and 11 supervisor cycles.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from helpers import assert_trees_close, compile_for, target
from hypothesis import given, settings
from hypothesis import strategies as st

import lowering
from lowering import fuse_elementwise, interpret, lower
from partitioner.cost.fused import fused_cycles

TARGET = target(16)  # compile_for's


def _fusions(compiled) -> list:
    return [t for t in compiled.program.tasks if t.op.name == "fusion"]


def chain(x, y, z):
    return jnp.maximum(x * y + z, 0).astype(jnp.float32)


def test_a_chain_is_one_superstep_at_the_hand_derived_cycles() -> None:
    """relu(x * y + z) cast to float, halves [4096] on 16 tiles: one superstep.

    Members multiply, add, maximum, convert: arithmetic per element 1/4 + 1/4 + 4/4 + 1/2 = 2
    thread cycles; memory per element: three halves loaded and a float stored, 10 bytes at 8 a
    cycle = 5/4. The chain's vector is 2 elements (it has floats). Its block of 256 elements
    per tile (4,096 over 16 tiles): 43 per worker, 22 vectors, 44 elements x 2 = 88 cycles;
    6 x (29 + 88) + 11 = 713."""
    args = [np.ones(4096, np.float16)] * 3
    compiled = compile_for(chain, *args)
    (fused,) = _fusions(compiled)
    assert [m.name for m in lowering.members(fused.op)] == [
        "multiply",
        "add",
        "maximum",
        "convert",
    ]
    assert fused.result_layouts[0].block_elements == 256
    (step,) = fused.supersteps
    assert step.compute_cycles == 713
    assert step.name == "fusion(multiply, add, maximum, convert)"
    assert_trees_close(compiled(*args), jax.jit(chain)(*args))


def test_unfused_the_chain_pays_a_superstep_per_op() -> None:
    args = [np.ones(4096, np.float16)] * 3
    fused = compile_for(chain, *args)
    apart = compile_for(chain, *args, fuse=False)
    assert not _fusions(apart)
    steps = [s for t in apart.program.tasks for s in t.supersteps if s.compute_cycles]
    assert len(steps) == 4
    assert fused.cost_report().total_cycles < apart.cost_report().total_cycles


def test_a_large_value_read_twice_is_stored_and_not_fused_into_both() -> None:
    """`a = x * y` read by two chains stays a tensor of its own: fusing it into both would
    compute it twice."""

    def f(x, y):
        a = x * y
        return jnp.exp(a) + 1.0, jnp.tanh(a) * 2.0

    x = np.linspace(-1, 1, 8192, dtype=np.float32)
    compiled = compile_for(f, x, x)
    names = [t.op.name for t in compiled.program.tasks]
    assert "multiply" in names
    assert names.count("fusion") == 2
    assert_trees_close(compiled(x, x), jax.jit(f)(x, x))


def test_chains_sharing_a_small_value_are_one_map_expression_of_two_results() -> None:
    """The same for 512 elements (a normalisation's [C] vector): `a` is computed once, in
    one map expression that runs both chains and writes both results (a fusion gives out a
    member's result besides its root's when every other reader comes after it). By hand: the
    chain's cycles as `cost.fused` counts them, its memory two floats loaded and two stored
    (the extra result's store counted as a load is; here the exp and tanh's arithmetic is
    the larger), one superstep instead of three."""

    def f(x, y):
        a = x * y
        return jnp.exp(a) + 1.0, jnp.tanh(a) * 2.0

    x = np.linspace(-1, 1, 512, dtype=np.float32)
    compiled = compile_for(f, x, x)
    (task,) = [t for t in compiled.program.tasks if t.supersteps]
    members = lowering.members(task.op)
    assert sorted(m.name for m in members) == sorted(
        ["multiply", "exponential", "add", "tanh", "multiply"]
    )
    assert len(task.op.results) == len(task.result_layouts) == 2
    block = task.result_layouts[0].block_elements
    f32 = np.dtype(np.float32)
    want = fused_cycles(members, block, [f32, f32, f32], f32, TARGET)
    assert task.supersteps[0].compute_cycles == want
    assert_trees_close(compiled(x, x), jax.jit(f)(x, x))


def test_a_value_read_before_the_chain_ends_is_not_given_out() -> None:
    """`a` read by an op between its chain's members and the chain's end (a reduction of it,
    here) cannot come out of the chain at its end: the chain stops at `a`."""

    def f(x, y):
        a = x * y
        total = a.sum()
        return jnp.exp(a) + total

    x = np.linspace(-1, 1, 512, dtype=np.float32)
    compiled = compile_for(f, x, x)
    assert all(len(t.op.results) == 1 for t in compiled.program.tasks)
    assert_trees_close(compiled(x, x), jax.jit(f)(x, x))


def test_a_reduction_takes_its_operands_chain_as_prologue() -> None:
    """A variance in float of halves: convert, subtract, square and the sum are one fusion whose
    first stage reduces where the halves lie; the values are jax.jit's."""

    def variance(x):
        return jnp.sum(jnp.square(x.astype(jnp.float32) - 0.5), axis=0)

    x = np.random.default_rng(0).normal(size=(256, 64)).astype(np.float16)
    compiled = compile_for(variance, x)
    (fused,) = _fusions(compiled)
    names = [m.name for m in lowering.members(fused.op)]
    assert names[:2] == ["convert", "subtract"] and names[-1] == "reduce"
    assert fused.supersteps[0].name.startswith("fusion(convert, subtract, ")
    assert_trees_close(compiled(x), jax.jit(variance)(x), rtol=1e-5, atol=1e-4)


def test_a_mean_divides_and_casts_as_the_reduction_writes_its_output() -> None:
    """A per-channel mean of halves cast back to half, [256, 64] -> [64]: popops' reduce
    scales and casts its output as it writes it (`ReduceParams`' scale, the output's type), so
    the division and the cast are the reduction's epilogue, not supersteps of their own.

    By hand: the sum's stages are those of the same sum without them; its last stage also runs
    the epilogue over each tile's outputs. The 64 outputs lie 4 a tile on the 16 tiles: per
    worker at most 1 element, a float divide 10 cycles per 2 (PopLibs' `BinaryOp` rate: 5 an
    element) and a cast of a float to a half 1/2: ceil(5 + 1/2) = 6 thread cycles, x 6
    workers = 36."""

    def mean(x):
        return jnp.mean(x, axis=0, dtype=jnp.float32).astype(jnp.float16)

    def total(x):
        return jnp.sum(x, axis=0, dtype=jnp.float32)

    x = np.random.default_rng(0).normal(size=(256, 64)).astype(np.float16)
    compiled, plain = compile_for(mean, x), compile_for(total, x)
    (fused,) = _fusions(compiled)
    (summed,) = _fusions(plain)
    assert [m.name for m in lowering.members(fused.op)] == [
        "convert",
        "reduce",
        "divide",
        "convert",
    ]
    assert [t.op.name for t in compiled.program.tasks if t.supersteps] == ["fusion"]
    assert fused.result_layouts[0].block_elements == 4
    *stages, last = fused.supersteps
    *plain_stages, plain_last = summed.supersteps
    assert [s.compute_cycles for s in stages] == [s.compute_cycles for s in plain_stages]
    assert last.compute_cycles == plain_last.compute_cycles + 36
    assert_trees_close(compiled(x), jax.jit(mean)(x))


def test_an_epilogue_never_takes_another_chain() -> None:
    """A mean's result that meets another tensor's chain ends the reduction's fusion: the
    chain is not fused in as a prologue, and the values are jax.jit's."""

    def f(x, y):
        m = jnp.mean(x, axis=0)
        return jnp.tanh(m * (y * 2.0 + 1.0))

    x = np.random.default_rng(1).normal(size=(128, 32)).astype(np.float32)
    y = np.linspace(-1, 1, 32, dtype=np.float32)
    compiled = compile_for(f, x, y)
    for task in _fusions(compiled):
        names = [m.name for m in lowering.members(task.op)]
        if "reduce" in names:
            assert names[names.index("reduce") + 1 :] in ([], ["divide"])
    assert_trees_close(compiled(x, y), jax.jit(f)(x, y), rtol=1e-6)


def test_chains_in_a_loop_body_fuse_and_keep_the_values() -> None:
    def f(x):
        return jax.lax.fori_loop(0, 5, lambda i, c: jnp.tanh(c * 1.5 + 0.25) - c * 0.1, x)

    x = np.linspace(-2, 2, 1024, dtype=np.float32)
    compiled = compile_for(f, x)
    (loop,) = [t for t in compiled.program.tasks if t.op.name == "while"]
    body = loop.op.regions[1]
    assert any(op.name == "fusion" for op in body.ops)
    assert_trees_close(compiled(x), jax.jit(f)(x))


def test_a_chain_reads_through_a_reshape() -> None:
    """Batch norm's normalisation made in a [replicas, N, ...] view and read back as [N, ...] by
    a ReLU: the reshape is a view (a bitcast in XLA), so the multiply, add, reshape and maximum
    are one map expression, one pass over the tensor, laid out where the activation lies."""

    def norm_relu(x, a, b):
        shares = x.reshape(1, *x.shape)
        return jnp.maximum((shares * a + b).reshape(x.shape), 0)

    x = np.random.default_rng(2).normal(size=(8, 64)).astype(np.float16)
    a, b = np.float16(1.5) * np.ones((1, 8, 64), np.float16), np.ones((1, 8, 64), np.float16)
    compiled = compile_for(norm_relu, x, a, b)
    apart = compile_for(norm_relu, x, a, b, fuse=False)
    (fused,) = _fusions(compiled)
    assert [m.name for m in lowering.members(fused.op)] == ["multiply", "add", "reshape", "maximum"]
    assert len([t for t in compiled.program.tasks if t.supersteps]) == 1
    assert compiled.cost_report().total_cycles < apart.cost_report().total_cycles
    assert_trees_close(compiled(x, a, b), jax.jit(norm_relu)(x, a, b))


def test_as_text_shows_a_fusion_with_its_members() -> None:
    args = [np.ones(4096, np.float16)] * 3
    text = compile_for(chain, *args).as_text()
    assert "fusion(multiply, add, maximum, convert)" in text


_UNARY = {
    # views a chain reads through: a reshape and back, a broadcast adding a dimension of one
    "reshaped": lambda x: jnp.tanh(x.reshape(8, 8)).reshape(64),
    "expanded": lambda x: jax.lax.broadcast_in_dim(x, (1, 64), (1,)).reshape(64) * 1.5,
    "exponential": jax.lax.exp,
    "tanh": jax.lax.tanh,
    "negate": jax.lax.neg,
    "abs": jax.lax.abs,
    "logistic": jax.lax.logistic,
}
_BINARY = {
    "add": jax.lax.add,
    "subtract": jax.lax.sub,
    "multiply": jax.lax.mul,
    "maximum": jax.lax.max,
    "minimum": jax.lax.min,
}


@st.composite
def _programs(draw):
    """A random program of elementwise ops over three float inputs, some values read twice."""
    op = st.sampled_from(sorted(_UNARY) + sorted(_BINARY))
    steps = draw(
        st.lists(st.tuples(op, st.integers(0, 99), st.integers(0, 99)), min_size=1, max_size=12)
    )
    return steps, draw(st.integers(1, 3))


def _run(steps, outs):
    def f(a, b, c):
        values = [a, b, c]
        for name, i, j in steps:
            x, y = values[i % len(values)], values[j % len(values)]
            values.append(_UNARY[name](x) if name in _UNARY else _BINARY[name](x, y))
        return tuple(values[-outs:])

    return f


@settings(max_examples=40, deadline=None)
@given(_programs())
def test_fusion_never_changes_a_value(program) -> None:
    """Any program of elementwise ops: the fused graph computes exactly what the graph does,
    and every fusion's intermediates are read by nothing outside it."""
    f = _run(*program)
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    graph = lower(f, x, x * 2, x * 3)
    fused = fuse_elementwise(graph)
    expected = interpret(graph, (x, x * 2, x * 3))
    got = interpret(fused, (x, x * 2, x * 3))
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    outside = {v for op in fused.ops for v in op.operands} | set(fused.outputs)
    for op in fused.ops:
        if op.name == "fusion":
            inner = {v for m in lowering.members(op) for v in m.results}
            assert not inner & outside
    assert sum(len(lowering.members(op)) for op in fused.ops) == len(graph.ops)


def test_the_cost_rule_counts_the_members_flops() -> None:
    args = [np.ones(4096, np.float16)] * 3
    (fused,) = _fusions(compile_for(chain, *args))
    # multiply, add and maximum one FLOP an element each; a cast counts none (XLA's convention)
    assert lowering.op_cost(fused.op).flops == 3 * 4096
    # it reads x, y, z and the broadcast zero (halves) and writes floats: no intermediates
    assert lowering.op_cost(fused.op).bytes == 4 * 4096 * 2 + 4096 * 4

"""Which mesh axes a per-IPU value differs over (`partitioner.varying_over`), as the runtime's
vmap and the phases' replicated tensor sharding read it.

A combined all-reduce (the combiner merges small gradient sums into one op of several operands)
sums each operand alone, so each result varies as its own operand does: a tp-split weight's
gradient and a tp-replicated norm scale's gradient in one dp buffer stay split and replicated.
Taken as a whole, the op had made every result vary over tp, and the runtime then kept a tp
dimension for each replicated output (a broadcast, then a slice back to one IPU's copy)."""

from __future__ import annotations

import jax
import numpy as np
from helpers import assert_trees_close, load_example

import ipujax
from lowering import Op, Value
from partitioner import Sharding, varying_over

F32 = np.dtype(np.float32)


def test_a_combined_all_reduce_varies_per_operand() -> None:
    """By hand: `w` is split over tp, `s` replicated; their dp all-reduce, combined, gives
    w' varying over tp alone (dp joined) and s' over nothing, and what reads s' alone over
    nothing too; an all-reduce of `w` alone says the same of w'."""
    w, s = Value(0, (4, 8), F32), Value(1, (8,), F32)
    w2, s2, both = Value(2, (4, 8), F32), Value(3, (8,), F32), Value(4, (8,), F32)
    reduce = Op("all_reduce", (w, s), (w2, s2), {"axes": ("dp",), "group_size": 2})
    add = Op("add", (s2, s2), (both,))
    shardings = [Sharding(((), ("tp",))), Sharding(((),))]
    varying = varying_over((w, s), (reduce, add), shardings)
    assert varying[w2] == frozenset({"tp"})
    assert varying[s2] == frozenset()
    assert varying[both] == frozenset()
    alone = Op("all_reduce", (w,), (w2,), {"axes": ("dp",), "group_size": 2})
    assert varying_over((w, s), (alone,), shardings)[w2] == frozenset({"tp"})


def test_a_tensor_parallel_gpt_step_keeps_no_tp_copy_of_its_replicated_outputs() -> None:
    """The GPT AdamW step on dp 2 x tp 2: every output its out sharding replicates over tp
    varies over no tp (the norm scales and biases, their Adam moments, the loss), and the
    values are jax.jit's."""
    workloads = load_example("gpt", "workloads")
    model = workloads.model
    config = model.Config(vocab=64, seq=16, layers=2, d_model=32, heads=4)
    optimizer = model.make_optimizer()
    params = model.init(jax.random.key(0), config)
    state = optimizer.init(params)
    tokens = np.random.default_rng(0).integers(0, 64, (4, 17)).astype(np.int32)
    mesh = ipujax.make_mesh((2, 2), ("dp", "tp"), target=ipujax.Target.bow().with_tiles(16))
    kwargs = workloads._jit_kwargs(mesh, params, state, config)
    step = model.make_train_step(optimizer)
    compiled = ipujax.jit(step, **kwargs).lower(params, state, tokens).compile()
    built = compiled.built
    program, partitioned = built.program, built.partitioned
    varying = varying_over(
        program.inputs, (t.op for t in program.tasks), partitioned.input_shardings
    )
    replicated = [
        v
        for v, s in zip(program.outputs, partitioned.output_shardings, strict=True)
        if "tp" not in s.axes
    ]
    assert replicated
    assert all("tp" not in varying[v] for v in replicated)
    assert_trees_close(
        compiled(params, state, tokens), jax.jit(step)(params, state, tokens), rtol=1e-4, atol=1e-5
    )

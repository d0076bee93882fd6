"""Shared helpers of the partitioner tests: small targets and meshes, the FFN the closed forms
are stated for, the layered MLP the phased tests stream, the ring formulas of docs/target.md
("IPU-Links and systems"), and pairing each collective of the cost report with the per-IPU op
it costs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import ipujax
from lowering import Op

F32 = 4  # bytes per f32 element (e in the closed forms)


def target(tiles: int = 16) -> ipujax.Target:
    """A Bow IPU cut down to `tiles` tiles."""
    return ipujax.Target.bow().with_tiles(tiles)


def mesh(shape: Sequence[int], names: Sequence[str], tiles: int = 16) -> ipujax.Mesh:
    return ipujax.make_mesh(tuple(shape), tuple(names), target=target(tiles))


def compile_sharded(
    fun: Any,
    the_mesh: ipujax.Mesh,
    args: Sequence[Any],
    in_shardings: Any = None,
    out_shardings: Any = None,
    **options: Any,
) -> ipujax.Compiled:
    jitted = ipujax.jit(
        fun, mesh=the_mesh, in_shardings=in_shardings, out_shardings=out_shardings, **options
    )
    return jitted.lower(*args).compile()


# ---- the FFN of the closed forms -----------------------------------------------------------------


def ffn(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    return jax.nn.gelu(x @ w1) @ w2


def ffn_loss(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    return jnp.sum(ffn(x, w1, w2) ** 2)


ffn_value_and_grads = jax.value_and_grad(ffn_loss, argnums=(0, 1, 2))


def ffn_args(tokens: int, hidden: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """x [T, h], w1 [h, 4h], w2 [4h, h], f32."""
    rng = np.random.RandomState(seed)
    x = rng.randn(tokens, hidden).astype(np.float32)
    w1 = (0.2 * rng.randn(hidden, 4 * hidden)).astype(np.float32)
    w2 = (0.2 * rng.randn(4 * hidden, hidden)).astype(np.float32)
    return x, w1, w2


# ---- the layered MLP of the phased tests ---------------------------------------------------------


def tanh_layers(ws: Sequence[jax.Array], x: jax.Array) -> jax.Array:
    """x -> tanh(x @ w) for each weight, the i-th under `jax.named_scope(f"layer{i}")`."""
    for i, w in enumerate(ws):
        with jax.named_scope(f"layer{i}"):
            x = jnp.tanh(x @ w)
    return x


def square_loss(ws: Sequence[jax.Array], x: jax.Array) -> jax.Array:
    return (tanh_layers(ws, x) ** 2).mean()


def sgd_step(ws: Sequence[jax.Array], x: jax.Array) -> tuple[list[jax.Array], jax.Array]:
    """One SGD step (learning rate 0.1) on `square_loss`: the new weights and the loss."""
    loss, grads = jax.value_and_grad(square_loss)(ws, x)
    return [w - 0.1 * g for w, g in zip(ws, grads, strict=True)], loss


# ---- ring closed forms ---------------------------------------------------------------------------


def all_reduce_bytes(n: int, buffer_bytes: int) -> int:
    """A ring AllReduce sends 2 (n-1)/n N bytes per participant (rounded up)."""
    return math.ceil(2 * (n - 1) * buffer_bytes / n)


def gather_bytes(n: int, buffer_bytes: int) -> int:
    """AllGather and ReduceScatter send (n-1)/n N (N the whole, gathered size)."""
    return math.ceil((n - 1) * buffer_bytes / n)


# ---- collectives: the report's entries with the per-IPU ops they cost ----------------------------


def collective_ops(compiled: ipujax.Compiled) -> list[Op]:
    """The per-IPU program's collective ops, in program order."""
    assert compiled.partitioned is not None
    kinds = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
    return [op for op in compiled.partitioned.graph.ops if op.name in kinds]


def collectives(compiled: ipujax.Compiled) -> list[tuple[ipujax.CollectiveCost, Op]]:
    """Each collective of the cost report with the op it costs (the report lists them in
    program order, one superstep per collective)."""
    ops = [
        task.op
        for task in compiled.program.tasks
        for step in task.supersteps
        if step.kind == "collective"
    ]
    report = compiled.cost_report().collectives
    assert len(ops) == len(report)
    assert ops == collective_ops(compiled)
    for cost, op in zip(report, ops, strict=True):
        assert cost.kind == op.name
        assert tuple(cost.axes) == tuple(op.attrs["axes"])
        assert cost.group_size == op.attrs["group_size"]
    return list(zip(report, ops, strict=True))


def buffer_bytes(op: Op) -> int:
    """N of the closed form: the gathered result for AllGather, the operand otherwise."""
    return op.results[0].nbytes if op.name == "all_gather" else op.operands[0].nbytes


def summary(compiled: ipujax.Compiled) -> list[tuple[str, tuple[str, ...], tuple[int, ...]]]:
    """(kind, axes, per-IPU operand shape) of every collective: for readable failures."""
    return [
        (op.name, tuple(op.attrs["axes"]), tuple(op.operands[0].shape))
        for op in collective_ops(compiled)
    ]

"""The runtime's folded sums (`runtime/fused_sums`): an all-reduce of a contraction over IPUs
held on one device runs as one contraction of every IPU's operands. Checked against jax.jit
on the programs where the partitioner makes such sums (a weight's gradient over data-parallel
replicas, a row-parallel matmul over tp, a convolution's weight gradient, a sum over a split
batch), and on the program's structure: what is folded, and what is left alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_trees_close, target
from jax.sharding import PartitionSpec as P

import ipujax
from ipujax.runtime.fused_sums import fuse_sums
from lowering.evaluator import flatten_args
from partitioner import Program, Sharding, varying_over

RNG = np.random.default_rng(0)


def _normal(*shape: int) -> np.ndarray:
    return RNG.normal(size=shape).astype(np.float32)


def _mlp_grads(w1: Any, w2: Any, x: Any) -> Any:
    def loss(w1: Any, w2: Any) -> Any:
        return jnp.mean(jnp.tanh(x @ w1) @ w2) ** 2

    return jax.grad(loss, argnums=(0, 1))(w1, w2)


def _conv_grad(w: Any, x: Any) -> Any:
    def loss(w: Any) -> Any:
        y = jax.lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        return jnp.sum(jnp.tanh(y))

    return jax.grad(loss)(w)


def _column_sums(x: Any, y: Any) -> Any:
    return jnp.sum(x * y, axis=0), jnp.sum(x, axis=(0, 1))


def _matmul(x: Any, w: Any) -> Any:
    return x @ w


def _batch_sum(h: Any) -> Any:
    return h.sum(0)  # float16: jax adds in float32 and casts once; a fused cast, sum, cast here


# name: (function, arguments, mesh shape, axis names, input specs)
CASES: dict[str, tuple[Callable[..., Any], tuple[np.ndarray, ...], tuple, tuple, tuple]] = {
    "dp weight gradients": (
        _mlp_grads,
        (_normal(16, 32), _normal(32, 8), _normal(24, 16)),
        (4,),
        ("dp",),
        (P(), P(), P("dp")),
    ),
    "dp x tp row-parallel": (
        _mlp_grads,
        (_normal(16, 32), _normal(32, 8), _normal(24, 16)),
        (2, 2),
        ("dp", "tp"),
        (P(None, "tp"), P("tp"), P("dp")),
    ),
    "dp convolution weight gradient": (
        _conv_grad,
        (_normal(3, 3, 4, 8), _normal(8, 6, 6, 4)),
        (4,),
        ("dp",),
        (P(), P("dp")),
    ),
    "bfloat16 row-parallel matmul": (
        _matmul,
        (_normal(8, 16).astype(jnp.bfloat16), _normal(16, 8).astype(jnp.bfloat16)),
        (2, 2),
        ("dp", "tp"),
        (P(None, "tp"), P("tp", None)),
    ),
    "float16 sum over a dp-split batch": (
        _batch_sum,
        ((100 * _normal(64, 16)).astype(np.float16),),
        (2, 2),
        ("dp", "tp"),
        (P("dp"),),
    ),
    "dp sums over the batch": (
        _column_sums,
        (_normal(8, 6, 5), _normal(8, 6, 5)),
        (4,),
        ("dp",),
        (P("dp"), P("dp")),
    ),
}


def _compiled(name: str) -> tuple[ipujax.Compiled, tuple[np.ndarray, ...]]:
    fun, args, shape, names, specs = CASES[name]
    mesh = ipujax.make_mesh(shape, names, target=target(16))
    return ipujax.jit(fun, mesh=mesh, in_shardings=specs).lower(*args).compile(), args


def _varying(compiled: ipujax.Compiled, shardings: Any = None) -> Any:
    assert compiled.partitioned is not None
    program = compiled.program
    shardings = compiled.partitioned.input_shardings if shardings is None else shardings
    return varying_over(program.inputs, (t.op for t in program.tasks), shardings)


def _folded(compiled: ipujax.Compiled, axes: Any = None) -> Program:
    axes = compiled.mesh.axis_names if axes is None else axes
    return fuse_sums(compiled.program, _varying(compiled), axes)


def _sources(program: Program) -> dict[str, int]:
    """How many all-reduce operands each kind of op makes (directly or through views), and how
    many no task makes ("folded": the all-reduce computes them itself)."""
    producers = {v: t for t in program.tasks for v in t.op.results}
    found: dict[str, int] = {}
    for task in program.tasks:
        if task.op.name != "all_reduce":
            continue
        for value in task.op.operands:
            source = producers.get(value)
            while source is not None and source.op.name in ("reshape", "transpose"):
                source = producers.get(source.op.operands[0])
            kind = "folded" if source is None else source.op.name
            found[kind] = found.get(kind, 0) + 1
    return found


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_equal_jax_jit(name: str) -> None:
    compiled, args = _compiled(name)
    assert_trees_close(compiled(*args), jax.jit(CASES[name][0])(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_sum_of_a_contraction_is_folded(name: str) -> None:
    """Every all-reduce operand made by a contraction of values that differ across its IPUs is
    folded; one whose operand is the same on every IPU (a gradient broadcast from the loss,
    say) is left as it was."""
    compiled, _ = _compiled(name)
    program = compiled.program
    varying = _varying(compiled)
    before = _sources(program)
    assert "folded" not in before
    folded = _folded(compiled)
    after = _sources(folded)
    assert after.get("folded"), after
    assert sum(after.values()) == sum(before.values())  # the same all-reduces, operand for operand
    assert len(folded.tasks) < len(program.tasks)
    producers = {v: t for t in folded.tasks for v in t.op.results}
    for task in folded.tasks:
        if task.op.name != "all_reduce":
            continue
        axes = set(task.op.attrs["axes"])
        for value in task.op.operands:
            source = producers.get(value)
            if source is not None and source.op.name in ("dot_general", "convolution"):
                alike = [v for v in source.op.operands if not axes <= varying[v]]
                assert alike, f"{source.op.name} of values differing over {axes} not folded"


def test_axes_on_other_devices_are_left_alone() -> None:
    compiled, _ = _compiled("dp weight gradients")
    assert _folded(compiled, axes=()) is compiled.program


def test_operands_the_same_on_every_ipu_are_not_folded() -> None:
    """Gathering a value every IPU holds alike would copy it once per IPU: with the inputs
    taken as replicated, nothing derived from them differs, and nothing is folded."""
    compiled, _ = _compiled("dp weight gradients")
    replicated = [Sharding.replicated(len(v.shape)) for v in compiled.program.inputs]
    assert fuse_sums(compiled.program, _varying(compiled, replicated), ("dp",)) is compiled.program


def test_a_convolution_weight_gradient_is_not_grouped() -> None:
    """vmapped over the replicas, the weight gradient is a convolution with one feature group
    per replica, which XLA:CPU runs several times slower than the ungrouped one jax.jit runs."""
    compiled, args = _compiled("dp convolution weight gradient")
    with jax.enable_x64(True):
        flat = flatten_args(compiled.graph, args, {}, False)
        text = compiled._runner().lower(*flat).as_text()
    assert "convolution" in text
    assert "feature_group_count = 4" not in text

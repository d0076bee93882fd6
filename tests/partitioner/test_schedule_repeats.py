"""The scheduler's copies of repeated ops' tasks (`partitioner.tiles.repeats`) are what the tile
rules would have made: programs scheduled with and without them are equal task by task, the
rules read nothing of the ops around beyond what the copies are keyed by, and the copies run
to jax.jit's values. Op signatures (`lowering.signature`) tell equal ops from different ones."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from partition_helpers import mesh

import ipujax
from lowering import Graph, Op, Value, lower, op_signature
from partitioner.cost.links import LinkModel
from partitioner.program import Program, Task
from partitioner.tiles import schedule as schedule_module
from partitioner.tiles.context import MappingContext
from partitioner.tiles.rules import TILE_RULES
from partitioner.tiles.rules.matmul import LAID_OUT_FOR_CONSUMER

LAYERS = 4


def _layer(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    h = (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5)
    scores = jax.nn.softmax(h @ h.T / 8.0, axis=-1)
    return x + jax.nn.gelu((scores @ h) @ w1) @ w2


def _looped_loss(x: jax.Array, w1s: jax.Array, w2s: jax.Array) -> jax.Array:
    for i in range(LAYERS):  # a Python loop: every layer's ops repeat
        x = _layer(x, w1s[i], w2s[i])
    return jnp.sum(x**2)


def _scanned_loss(x: jax.Array, w1s: jax.Array, w2s: jax.Array) -> jax.Array:
    def body(x: jax.Array, w: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
        return _layer(x, *w), None

    return jnp.sum(jax.lax.scan(body, x, (w1s, w2s))[0] ** 2)


def _conv_loss(x: jax.Array, k1: jax.Array, k2: jax.Array) -> jax.Array:
    for _ in range(2):
        x = jax.nn.relu(jax.lax.conv(x, k1, (1, 1), "SAME"))
        x = jax.lax.conv(x, k2, (1, 1), "SAME") + x
    return jnp.sum(x.max(axis=(2, 3)))


def _dense_args() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    return (
        rng.normal(size=(16, 32)).astype(np.float32),
        (rng.normal(size=(LAYERS, 32, 64)) / 8).astype(np.float32),
        (rng.normal(size=(LAYERS, 64, 32)) / 8).astype(np.float32),
    )


def _conv_args() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(1)
    return (
        rng.normal(size=(2, 4, 8, 8)).astype(np.float32),
        (rng.normal(size=(4, 4, 3, 3)) / 6).astype(np.float32),
        (rng.normal(size=(4, 4, 1, 1)) / 2).astype(np.float32),
    )


def _megatron() -> dict[str, Any]:
    return {
        "mesh": mesh((2, 2), ("dp", "tp")),
        "in_shardings": (P("dp"), P(None, None, "tp"), P(None, "tp")),
    }


# (loss, arguments, ipujax.jit keywords)
CASES = {
    "python loop, one IPU": (_looped_loss, _dense_args, lambda: {"mesh": mesh((1,), ("x",))}),
    "python loop, dp2 x tp2": (_looped_loss, _dense_args, _megatron),
    "scan, dp2 x tp2": (_scanned_loss, _dense_args, _megatron),
    "convolutions, one IPU": (_conv_loss, _conv_args, lambda: {"mesh": mesh((1,), ("x",))}),
}


def _compiled(case: str) -> tuple[ipujax.Compiled, Callable, tuple]:
    loss, make_args, options = CASES[case]
    step = jax.value_and_grad(loss, argnums=(0, 1, 2))
    args = make_args()
    return ipujax.jit(step, **options()).lower(*args).compile(), step, args


def _schedule(compiled: ipujax.Compiled, reuse: bool) -> Program:
    built = compiled.built
    the_mesh = built.mesh
    links = None
    if built.partitioned is not None:
        links = LinkModel.place(the_mesh.shape, the_mesh.target, the_mesh.system)
    return schedule_module.schedule(built.graph, built.target, links, reuse=reuse)


def _fields(task: Task) -> tuple:
    steps = tuple(dataclasses.asdict(s) for s in task.supersteps)  # every field, compared or not
    return (
        task.op,
        task.inputs,
        task.input_layouts,
        task.result_layouts,
        steps,
        task.temporaries,
        task.aliases,
        task.trips,
        tuple(tuple(_fields(t) for t in region.tasks) for region in task.regions),
    )


@pytest.mark.parametrize("case", list(CASES))
def test_copies_are_the_tasks_the_rules_make(case: str) -> None:
    compiled, _, _ = _compiled(case)
    copied, made = _schedule(compiled, True), _schedule(compiled, False)
    assert len(copied.tasks) == len(made.tasks)
    for a, b in zip(copied.tasks, made.tasks, strict=True):
        assert _fields(a) == _fields(b), a.op.name
    assert copied.layouts == made.layouts
    assert copied.input_layouts == made.input_layouts


def test_a_python_loop_runs_each_layers_rules_once(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled, _, _ = _compiled("python loop, dp2 x tp2")
    calls = {"n": 0}
    for name, rule in list(TILE_RULES.items()):

        def counted(*args: Any, rule: Any = rule) -> Task:
            calls["n"] += 1
            return rule(*args)

        monkeypatch.setitem(TILE_RULES, name, counted)
    program = _schedule(compiled, True)
    # Constants always run their rule; the rest of layers 2..4 are copies of layer 1's tasks.
    constants = sum(t.op.name == "constant" for t in program.tasks)
    assert calls["n"] - constants < 0.5 * (len(program.tasks) - constants)


class _Reads(dict):
    """ctx.producers, noting every value a rule asks the maker of."""

    asked: ClassVar[set[Value]] = set()

    def get(self, key: Any, default: Any = None) -> Any:
        _Reads.asked.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        _Reads.asked.add(key)
        return super().__getitem__(key)


@dataclasses.dataclass
class _ReadingContext(MappingContext):
    def __post_init__(self) -> None:
        self.producers = _Reads(self.producers)


def _keyed(op: Op, producers: dict[Value, Op]) -> set[Value]:
    """The values whose makers the copies' key names (`repeats._maker`): each operand, and the
    chain of views and collectives a matmul looks through."""
    named = set()
    for value in op.operands:
        named.add(value)
        maker = producers.get(value)
        while maker is not None and maker.name in LAID_OUT_FOR_CONSUMER:
            named.add(maker.operands[0])
            maker = producers.get(maker.operands[0])
    return named


@pytest.mark.parametrize("case", list(CASES))
def test_rules_read_only_the_makers_the_key_names(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled, _, _ = _compiled(case)
    strays: list[str] = []
    for name, rule in list(TILE_RULES.items()):

        def watched(op: Op, values: Any, layouts: Any, ctx: Any, rule: Any = rule) -> Task:
            _Reads.asked = set()
            task = rule(op, values, layouts, ctx)
            if op.name not in ("while", "case", "constant"):
                stray = _Reads.asked - _keyed(op, dict(ctx.producers))
                strays.extend(f"{op.name} read the maker of {v}" for v in stray)
            return task

        monkeypatch.setitem(TILE_RULES, name, watched)
    monkeypatch.setattr(schedule_module, "MappingContext", _ReadingContext)
    _schedule(compiled, False)
    assert strays == []


@pytest.mark.parametrize("case", list(CASES))
def test_scheduled_with_copies_the_program_runs_to_jax_jit_values(case: str) -> None:
    compiled, step, args = _compiled(case)
    got = compiled(*args)
    want = jax.jit(step)(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-5)


# ---- op signatures ---------------------------------------------------------------------------


def _ops(fun: Callable, *shapes: tuple[int, ...]) -> list[Op]:
    graph: Graph = lower(fun, *(jax.ShapeDtypeStruct(s, np.float32) for s in shapes))
    return list(graph.ops)


def test_the_layers_of_a_python_loop_have_equal_signatures() -> None:
    def two(x: jax.Array) -> jax.Array:
        for _ in range(2):
            x = jnp.tanh(x @ x) + 1.0
        return x

    ops = _ops(two, (8, 8))
    half = len(ops) // 2
    first, second = ops[:half], ops[half:]
    assert [op_signature(a) for a in first] == [op_signature(b) for b in second]
    assert all(a.results != b.results for a, b in zip(first, second, strict=True))


def test_signatures_tell_apart_what_an_op_does() -> None:
    def sums(x: jax.Array) -> tuple[jax.Array, ...]:
        return x.sum(0), x.max(0), x.sum(1), x * 2.0, x * 3.0, (x * 2.0).astype(jnp.int32)

    ops = _ops(sums, (4, 6))
    signatures = [op_signature(op) for op in ops]
    by_name: dict[str, set] = {}
    for op, signature in zip(ops, signatures, strict=True):
        by_name.setdefault(op.name, set()).add(signature)
    assert len(by_name["reduce"]) == 3  # sum and max (their regions), and over another axis
    scales = [op for op in ops if op.name == "constant" and float(op.attrs["value"]) in (2, 3)]
    assert len({op_signature(op) for op in scales}) == 2  # 2.0 and 3.0, by their bytes
    one = Op("iota", (), (Value(0, (4,), np.dtype(np.int32)),), {"dimension": 1})
    true = dataclasses.replace(one, attrs={"dimension": True})
    assert op_signature(one) != op_signature(true)

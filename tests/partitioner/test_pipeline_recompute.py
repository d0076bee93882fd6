"""Recomputation in a pipeline stage, derived by hand on a three-layer MLP in one stage: which
values it stashes (each layer's output another layer reads, Graphcore's checkpoint per layer),
that its backward reads only recomputed copies of the rest, made just before the backward that
reads them, and what that does to the stage's memory; and which ops of a fused program run
once per step (a fusion ending in a sum over the batch is accumulated over micro-batches)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowering import FUSION, Graph, fuse_elementwise, lower, members
from partitioner.layout import tile_bytes
from partitioner.memory.liveness import storage_owners
from partitioner.memory.tiles import TileMemory
from partitioner.phases.scopes import FORWARD
from partitioner.pipelines.microbatch import per_microbatch
from partitioner.pipelines.pipeline import Pipeline
from partitioner.pipelines.recompute import checkpoints, recomputed
from partitioner.pipelines.stage_memory import stage_memory, stashed
from partitioner.pipelines.stages import split_stages
from partitioner.program import Program
from partitioner.tiles.schedule import schedule
from tests.helpers import target

ROWS, D, HIDDEN, LAYERS = 64, 16, 64, 3
BATCH = 2  # the flat input index of x: w_in, w_out (sorted), then x


def _step(params: dict[str, list[jax.Array]], x: jax.Array) -> tuple:
    """Three MLP layers, each `tanh(h @ w_in) @ w_out` in a scope of its own, then the mean
    square; SGD."""

    def loss(p: dict[str, list[jax.Array]]) -> jax.Array:
        h = x
        for i in range(LAYERS):
            with jax.named_scope(f"layer{i}"):
                h = jnp.tanh(h @ p["w_in"][i]) @ p["w_out"][i]
        return jnp.mean(h**2)

    value, grads = jax.value_and_grad(loss)(params)
    return value, jax.tree.map(lambda w, g: w - 0.1 * g, params, grads)


def _args() -> tuple[dict[str, list[np.ndarray]], np.ndarray]:
    rng = np.random.default_rng(0)
    params = {
        "w_in": [rng.normal(size=(D, HIDDEN)).astype(np.float32) for _ in range(LAYERS)],
        "w_out": [rng.normal(size=(HIDDEN, D)).astype(np.float32) for _ in range(LAYERS)],
    }
    return params, rng.normal(size=(ROWS, D)).astype(np.float32)


class _Stage:
    """The step scheduled on a 16-tile Bow, in one stage of every layer."""

    def __init__(self) -> None:
        graph = fuse_elementwise(lower(_step, *_args()))
        self.graph = graph
        self.program = schedule(graph, target(16))
        self.batch_index = [i for i, v in enumerate(graph.inputs) if v.shape == (ROWS, D)]
        self.pipeline = Pipeline("pp", stages=[[f"layer{i}" for i in range(LAYERS)]])
        each = per_microbatch(graph, self.batch_index)
        self.split = split_stages(self.program, self.pipeline, 1, each)


@pytest.fixture(scope="module")
def stage() -> _Stage:
    return _Stage()


def _made_in(program: Program, indices: list[int]) -> set:
    return {v for i in indices for v in program.tasks[i].op.results}


def test_the_checkpoints_are_the_layers_outputs(stage: _Stage) -> None:
    """Layer 1 reads layer 0's output and layer 2 layer 1's: two [64, 16] values, the
    stage's checkpoints; layer 2's output goes to the loss, in no layer of its own."""
    kept = checkpoints(stage.program, stage.split, 0)
    assert sorted(v.shape for v in kept) == [(ROWS, D), (ROWS, D)]
    makers = {v: t.op for t in stage.program.tasks for v in t.op.results}
    scopes = sorted(makers[v].loc.scope.rsplit("/", 2)[-2] for v in kept)
    assert scopes == ["jvp(layer0)", "jvp(layer1)"]
    # Stashed per micro-batch with recomputation: the checkpoints, nothing received (the
    # stage's forward reads only arguments).
    assert set(stashed(stage.program, stage.split, 0, recompute=True)) == kept


def test_the_backward_reads_only_recomputed_copies(stage: _Stage) -> None:
    """After `recomputed`, no backward task reads a value the forward made, but for the
    checkpoints; each copy runs its original's op and is read after it is made; the forward,
    the backward and the update keep their order."""
    program, split = stage.program, stage.split
    own, origin = recomputed(program, split, 0)
    forwards = len(split.indices(0, (FORWARD,)))
    copies = {p for p, q in enumerate(origin) if p >= forwards and q < forwards}
    assert copies  # each layer's tanh, which its backward reads, is made again
    assert [q for p, q in enumerate(origin) if p not in copies] == list(
        range(len(origin) - len(copies))
    )
    made_forward = _made_in(own, list(range(forwards))) - checkpoints(program, split, 0)
    for p, task in enumerate(own.tasks[forwards:], start=forwards):
        if p not in copies:
            assert not made_forward & set(task.inputs), task.op
    read_at = {v: p for p, t in enumerate(own.tasks) for v in t.inputs}
    for p in copies:
        assert own.tasks[p].op.name == own.tasks[origin[p]].op.name
        assert own.tasks[p].op.loc == own.tasks[origin[p]].op.loc
        assert all(read_at.get(v, p + 1) > p for v in own.tasks[p].op.results)


def _tanh_results(op) -> list:
    """The results of `op` a tanh makes: its own, or those a fusion gives out from a tanh
    member (a multi-output fusion, `lowering.fusion`)."""
    if op.name != FUSION:
        return list(op.results) if op.name == "tanh" else []
    region = op.regions[0]
    made_by = {v: m.name for m in region.ops for v in m.results}
    return [
        v for v, inner in zip(op.results, region.outputs, strict=True) if made_by[inner] == "tanh"
    ]


def _tanhs_live(program: Program, memory: TileMemory) -> int:
    """The most tanh results [64, 64] (or copies of them) on chip at once."""
    owner = storage_owners(program)  # a tanh may overwrite its operand in place
    made = [v for t in program.tasks for v in _tanh_results(t.op)]
    tanh = {owner.get(v, v) for v in made}
    spans = [s for s in memory.storages if s.value in tanh]
    return max(sum(s.live_at(p) for s in spans) for p in range(len(program.tasks)))


def test_recomputation_holds_one_layers_activations(stage: _Stage) -> None:
    """The backward of each layer reads its tanh [64, 64] (tanh' = 1 - tanh^2, and the
    gradient of w_out). Without recomputation the three layers' tanh are all on chip when the
    backward begins; recomputing layer by layer, one at a time. Each is 64 x 64 x 4 / 16 =
    1,024 B per tile, so the stage's peak falls, by at most the two tanh it no longer holds."""
    program, split = stage.program, stage.split
    plain = Pipeline("pp", stages=stage.pipeline.stages)
    again = Pipeline("pp", stages=stage.pipeline.stages, recompute=True)
    held_program, held = stage_memory(program, split, 0, plain, target(16))
    own, lighter = stage_memory(program, split, 0, again, target(16))
    assert _tanhs_live(held_program, held) == LAYERS
    assert _tanhs_live(own, lighter) == 1
    tanh = next(v for t in program.tasks for v in _tanh_results(t.op))
    assert tile_bytes(program.layouts[tanh], tanh.dtype) == ROWS * HIDDEN * 4 // 16 == 1024
    saved = int(held.total.max()) - int(lighter.total.max())
    assert 0 < saved <= (LAYERS - 1) * 1024


def _scaled_step(params: dict[str, jax.Array], x: jax.Array) -> tuple:
    """One dense layer with a scale per output (as a layer norm's gain); the mean square; SGD."""

    def loss(p: dict[str, jax.Array]) -> jax.Array:
        with jax.named_scope("dense"):
            out = jnp.tanh((x @ p["w"]) * p["s"])
        return jnp.mean(out**2)

    value, grads = jax.value_and_grad(loss)(params)
    return value, jax.tree.map(lambda w, g: w - 0.1 * g, params, grads)


def test_a_fused_sum_over_the_batch_is_accumulated() -> None:
    """The scale's gradient is a sum over the batch of the backward's product (its gradient
    times x @ w): fused, one `fusion` whose root is that `reduce`. It runs per micro-batch; its
    result is summed over the micro-batches, so the update that reads it (s - 0.1 g, fused
    too) runs once per step, as unfused. (Seen as an opaque op, the fusion's result would vary
    by micro-batch and the update would run with every micro-batch.)"""
    rng = np.random.default_rng(0)
    params = {"s": np.ones(8, np.float32), "w": rng.normal(size=(4, 8)).astype(np.float32)}
    x = rng.normal(size=(16, 4)).astype(np.float32)
    graph: Graph = lower(_scaled_step, params, x)
    fused = fuse_elementwise(graph)
    batch = [i for i, v in enumerate(fused.inputs) if v.shape == (16, 4)]
    each = dict(zip(fused.ops, per_microbatch(fused, batch), strict=True))
    summed = [
        op
        for op in fused.ops
        if op.name == FUSION and members(op)[-1].name == "reduce" and op.results[0].shape == (8,)
    ]
    assert summed and all(each[op] for op in summed)
    scale = fused.inputs[0]
    assert scale.shape == (8,)
    updates = [op for op in fused.ops if scale in op.operands and op.results[0].shape == (8,)]
    updates = [op for op in updates if "subtract" in [m.name for m in members(op)]]
    assert len(updates) == 1 and not each[updates[0]]
    # The same answer as the unfused program's: per op, a fusion runs per micro-batch when
    # any of its members does.
    plain = dict(zip(graph.ops, per_microbatch(graph, batch), strict=True))
    subtracts = [op for op in graph.ops if op.name == "subtract" and scale in op.operands]
    assert [plain[op] for op in subtracts] == [False]

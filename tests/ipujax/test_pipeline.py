"""Pipeline parallelism end to end on the tiny GPT of examples/gpt/workloads.py (blocks embed,
layer0, layer1, head, loss): over pp=2 with dp=2 and over pp=4 alone, the step's values are
`jax.jit`'s, and the cost report has the stages, micro-batches and pipeline cycles the schedule
says; explicit stages, each stage's memory on its IPUs, recomputation, the bubble, the report's
JSON, trace and HTML, and costing from shapes alone."""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ipujax
from ipujax import stages
from ipujax.views import trace
from ipujax.views.html.page import render_html
from ipujax.views.tables.phases import pipeline_tables
from partitioner.memory.check import largest_on_tile
from tests.helpers import assert_trees_close, load_example, target

RTOL, ATOL = 2e-5, 2e-6
MESHES = {
    "dp2_pp2": ((2, 2), ("dp", "pp")),
    "pp4": ((4,), ("pp",)),
}


class Tiny:
    """The tiny GPT's step, its arguments (8 sequences), the dp shardings, jax's results, and
    the compiled steps made so far (compiling is the slow part; several tests read one)."""

    def __init__(self) -> None:
        workloads = load_example("gpt", "workloads")
        dp = ipujax.make_mesh((2,), ("dp",))
        self.fun, self.args, kwargs = workloads.tiny(mesh=dp)
        assert self.args[2].shape == (8, 17)
        self.in_shardings = kwargs["in_shardings"]
        self._expected: Any = None
        self._compiled: dict[Any, ipujax.Compiled] = {}

    @property
    def expected(self) -> Any:
        if self._expected is None:
            self._expected = jax.jit(self.fun)(*self.args)
        return self._expected

    def jitted(self, mesh: str, **pipeline: Any) -> Any:
        shape, names = MESHES[mesh]
        kwargs: dict[str, Any] = {"mesh": ipujax.make_mesh(shape, names)}
        if "dp" in names:
            kwargs["in_shardings"] = self.in_shardings
        return ipujax.jit(self.fun, **kwargs, pipeline=ipujax.Pipeline("pp", **pipeline))

    def compiled(self, mesh: str, **pipeline: Any) -> ipujax.Compiled:
        key = (mesh, tuple(sorted((k, repr(v)) for k, v in pipeline.items())))
        if key not in self._compiled:
            self._compiled[key] = self.jitted(mesh, **pipeline).lower(*self.args).compile()
        return self._compiled[key]


@pytest.fixture(scope="module")
def tiny() -> Tiny:
    return Tiny()


def _assert_close(ours: Any, expected: Any) -> None:
    assert_trees_close(ours, expected, rtol=RTOL, atol=ATOL)


def _pp(mesh: str) -> int:
    shape, names = MESHES[mesh]
    return shape[names.index("pp")]


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("mesh", list(MESHES))
def test_values_and_the_report_of_a_pipelined_step(tiny: Tiny, mesh: str, n: int) -> None:
    """S stages, N micro-batches: N + 2 (S - 1) pipeline cycles (pp=2: N + 2; pp=4: N + 6),
    then the slowest stage's update."""
    compiled = tiny.compiled(mesh, microbatches=n)
    report = compiled.cost_report()
    pp = _pp(mesh)
    assert len(report.stages) == pp
    assert [s.stage for s in report.stages] == list(range(pp))
    assert report.microbatches == n
    assert len(report.pipeline_cycles) == n + 2 * (pp - 1)
    assert report.total_cycles == sum(report.pipeline_cycles) + max(
        s.update_cycles for s in report.stages
    )
    # Every block on exactly one stage, in the model's order.
    blocks = [b for s in report.stages for b in s.blocks]
    assert blocks == ["embed", "layer0", "layer1", "head", "loss"]
    assert all(s.blocks for s in report.stages)
    _assert_close(compiled(*tiny.args), tiny.expected)


def test_explicit_stages(tiny: Tiny) -> None:
    stages = [["embed", "layer0"], ["layer1", "head", "loss"]]
    report = tiny.compiled("dp2_pp2", stages=stages, microbatches=2).cost_report()
    assert [s.blocks for s in report.stages] == [("embed", "layer0"), ("layer1", "head", "loss")]
    # Other stages than auto's for the same mesh: the same blocks, moved.
    other = [["embed"], ["layer0", "layer1", "head", "loss"]]
    report = tiny.compiled("dp2_pp2", stages=other, microbatches=2).cost_report()
    assert [s.blocks for s in report.stages] == [("embed",), ("layer0", "layer1", "head", "loss")]


def test_each_ipu_holds_its_stages_memory(tiny: Tiny) -> None:
    """Mesh (dp=2, pp=2) in row-major order: IPU dp * 2 + pp. IPUs 0 and 2 are stage 0's,
    1 and 3 stage 1's."""
    report = tiny.compiled("dp2_pp2", microbatches=2).cost_report()
    rows = report.tile_memory
    assert rows.shape == (4, report.tiles_per_ipu)
    np.testing.assert_array_equal(rows[0], rows[2])
    np.testing.assert_array_equal(rows[1], rows[3])
    assert not np.array_equal(rows[0], rows[1])
    # Each stage's fullest tile is its peak.
    assert [int(rows[i].max()) for i in (0, 1)] == [s.peak_tile_bytes for s in report.stages]
    assert report.peak_tile_bytes == max(s.peak_tile_bytes for s in report.stages)


def test_recompute_runs_the_forward_again_in_the_backward(tiny: Tiny) -> None:
    plain = tiny.compiled("dp2_pp2", microbatches=4).cost_report()
    again = tiny.compiled("dp2_pp2", microbatches=4, recompute=True).cost_report()
    assert len(again.stages) == len(plain.stages) == 2
    for p, r in zip(plain.stages, again.stages, strict=True):
        assert p.blocks == r.blocks
        assert r.forward_cycles == p.forward_cycles
        assert p.recompute_cycles == 0
        assert r.recompute_cycles == r.forward_cycles
        assert r.backward_cycles == p.backward_cycles + p.forward_cycles
        assert r.stash_bytes <= p.stash_bytes
        assert r.in_flight == p.in_flight
        assert r.peak_tile_bytes <= p.peak_tile_bytes
    # pp=2, N=4: stage 0 holds min(4, 3) = 3 micro-batches, stage 1 one.
    assert [s.in_flight for s in again.stages] == [3, 1]
    # Recomputing, a stage stashes what its forward receives and each block's output another
    # of its blocks reads (Graphcore's checkpoint per layer). A micro-batch is 8 / 4 = 2
    # sequences over dp=2, 1 per IPU: an activation is 1 x 16 tokens x 32 x 4 bytes = 2,048.
    # Stage 0 receives arguments alone and stashes embed's output, which layer0 reads; stage 1
    # what stage 0 sends, layer1's output (head reads it) and head's logits (the loss reads
    # them), 1 x 16 x 256 x 4 = 16,384.
    # Stage 0 also sends the gradient clip's verdict and scale (a bool and a float), which
    # stage 1's clipped gradients read; their broadcasts run on stage 1, where they are read.
    first, second = again.stages
    assert first.stash_bytes == 2048
    assert second.return_bytes == 2048
    assert first.send_bytes == 2048 + 1 + 4
    assert second.stash_bytes == 2048 + 2048 + 16384  # the activation it received, not the scalars


def test_more_microbatches_of_the_same_size_shrink_the_bubble(tiny: Tiny) -> None:
    """Two sequences per micro-batch on pp=4; the batch is 2 N sequences."""
    tokens = np.concatenate([tiny.args[2], tiny.args[2]])  # 16 sequences
    bubbles = []
    for n in (2, 4, 8):
        args = (*tiny.args[:2], tokens[: 2 * n])
        jitted = tiny.jitted("pp4", microbatches=n)
        report = jitted.lower(*args).compile().cost_report()
        assert report.microbatches == n and len(report.pipeline_cycles) == n + 6
        bubbles.append(report.bubble_fraction)
    assert 0 < bubbles[2] < bubbles[1] < bubbles[0] < 1


def test_the_report_as_json_trace_and_html(tiny: Tiny) -> None:
    report = tiny.compiled("dp2_pp2", microbatches=4).cost_report()
    again = ipujax.CostReport.from_json(report.to_json())
    assert again == report
    assert again.stages == report.stages
    assert again.pipeline_cycles == report.pipeline_cycles
    assert again.bubble_fraction == report.bubble_fraction

    # The trace: a slice per (stage, micro-batch, direction), one update per stage.
    events = trace.build_trace(report)["traceEvents"]
    pipeline = [e for e in events if e.get("ph") == "X" and e.get("cat") == "pipeline"]
    s, n = len(report.stages), report.microbatches
    assert len(pipeline) == 2 * s * n + s
    runs = Counter(
        (e["args"]["stage"], e["args"]["micro_batch"], e["name"].split()[0])
        for e in pipeline
        if e["name"] != "update"
    )
    expected = {(k, m, d) for k in range(s) for m in range(n) for d in ("forward", "backward")}
    assert set(runs) == expected and set(runs.values()) == {1}
    updates = sorted(e["args"]["stage"] for e in pipeline if e["name"] == "update")
    assert updates == list(range(s))

    html = render_html(report)
    assert 'id="pipeline"' in html
    assert "pipeline timeline" in html

    # The terminal's tables: a row per stage under a title with the bubble.
    (table,) = pipeline_tables(report)
    assert f"bubble {100 * report.bubble_fraction:.1f}%" in str(table.title)
    assert table.row_count == len(report.stages)


def test_costing_from_shapes_then_running(tiny: Tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipelined compile from `jax.ShapeDtypeStruct`s costs without building the runner; the
    first call with arrays builds it and runs."""
    made: list[Any] = []
    real: Callable[..., Any] = stages.make_runner

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(stages, "make_runner", counted)
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), tiny.args)
    compiled = tiny.jitted("pp4", microbatches=2).lower(*shapes).compile()
    report = compiled.cost_report()
    assert len(report.stages) == 4 and report.microbatches == 2
    assert len(report.pipeline_cycles) == 2 + 2 * 3
    assert made == []
    _assert_close(compiled(*tiny.args), tiny.expected)
    assert len(made) == 1


def test_every_tensor_on_a_stage_is_described_received_ones_too(tiny: Tiny) -> None:
    """A stage's program reads what the stage before it sent, which no task of its own makes:
    the memory report describes those by the op that made them, on the other stage."""
    built = tiny.compiled("pp4", microbatches=2).built
    program, memory = built.stage_programs[1], built.stage_memories[1]
    own = {v for task in program.tasks for v in task.op.results}
    received = [v for v in program.inputs if v not in set(built.graph.inputs)]
    assert received and not set(received) & own  # stage 1 reads what stage 0 made
    tile = int(memory.total.argmax())
    described = largest_on_tile(memory, program, built.graph, tile, count=10**6)
    at = int(memory.peak_task[tile])
    here = [s for s in memory.storages if s.layout.start <= tile < s.layout.stop and s.live_at(at)]
    assert len(described) >= len(here) > 0
    assert all(" at " in text or text.startswith("argument") for _, text in described)


def _two_batch_step(w: jax.Array, x: jax.Array, y: jax.Array) -> jax.Array:
    def loss(w: jax.Array) -> jax.Array:
        with jax.named_scope("l0"):
            h = jnp.tanh(x @ w)
        with jax.named_scope("l1"):
            h = jnp.tanh(h @ w)
        return ((h - y) ** 2).mean()

    return w - 0.1 * jax.grad(loss)(w)


def test_a_second_batch_argument_left_whole_is_a_warning() -> None:
    # The default batch is the last argument: x, which leads with the batch's rows too, would
    # stay whole in every micro-batch. Named, the pipeline gives jax.jit's values, unwarned.
    mesh = ipujax.make_mesh((2,), ("pp",), target=target(16))
    rng = np.random.default_rng(0)
    w = rng.normal(size=(8, 8)).astype(np.float32) / 3
    x, y = rng.normal(size=(16, 8)).astype(np.float32), np.zeros((16, 8), np.float32)
    default = ipujax.Pipeline("pp", microbatches=4)
    warned = pytest.warns(ipujax.BatchArgumentWarning, match=r"batch_argnums=\(1, 2\)")
    # x whole against y's micro-batch: jax refuses the trace, after the warning said why.
    with warned, contextlib.suppress(TypeError):
        ipujax.jit(_two_batch_step, mesh=mesh, pipeline=default).lower(w, x, y)
    named = ipujax.Pipeline("pp", microbatches=4, batch_argnums=(1, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ipujax.BatchArgumentWarning)
        got = ipujax.jit(_two_batch_step, mesh=mesh, pipeline=named)(w, x, y)
    np.testing.assert_allclose(got, jax.jit(_two_batch_step)(w, x, y), rtol=1e-5, atol=1e-6)


def test_a_scalar_last_argument_is_no_batch() -> None:
    # The default batch is the last argument; a scalar (a learning rate) has no rows to cut: a
    # ConfigError saying so (the batch-argument check raised a raw IndexError on it first).
    mesh = ipujax.make_mesh((2,), ("pp",), target=target(16))
    jitted = ipujax.jit(
        lambda w, x, lr: _two_batch_step(w, x, x) * lr,
        mesh=mesh,
        pipeline=ipujax.Pipeline("pp", microbatches=2),
    )
    with pytest.raises(ipujax.ConfigError, match=r"argument 2 has no rows"):
        jitted.lower(np.eye(8, dtype=np.float32), np.ones((4, 8), np.float32), np.float32(0.1))

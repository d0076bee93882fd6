"""Pipeline parallelism's pure parts, derived by hand: the slots of a pipeline cycle, the
schedule's cycles and bubble, the micro-batches a stage holds, the balanced cut of blocks into
stages, which ops run once per micro-batch, and the configuration errors."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ipujax
from lowering import Graph, Op, lower
from partitioner.pipelines.microbatch import per_microbatch
from partitioner.pipelines.schedule import (
    StageCost,
    cycle_count,
    schedule_pipeline,
    send_cycles,
    slots,
)
from partitioner.pipelines.stage_memory import in_flight
from partitioner.pipelines.stages import balanced_stages
from tests.helpers import target

# ---- slots and the number of pipeline cycles ----------------------------------------------------


@given(st.integers(1, 6), st.integers(1, 20))
def test_each_stage_runs_each_microbatch_forward_once_and_backward_once(s: int, n: int) -> None:
    """Stage k runs micro-batch m's forward in cycle m + k and its backward in cycle
    m + 2 (S - 1) - k; the last backward (stage 0, micro-batch N - 1) is in cycle
    N - 1 + 2 (S - 1), so a step has N + 2 (S - 1) cycles."""
    assert cycle_count(s, n) == n + 2 * (s - 1)
    forwards: dict[tuple[int, int], list[int]] = {}
    backwards: dict[tuple[int, int], list[int]] = {}
    for stage in range(s):
        # A cycle before the first or after the last runs nothing.
        assert slots(stage, s, n, -1) == (None, None)
        assert slots(stage, s, n, cycle_count(s, n)) == (None, None)
        for cycle in range(cycle_count(s, n)):
            forward, backward = slots(stage, s, n, cycle)
            if forward is not None:
                forwards.setdefault((stage, forward), []).append(cycle)
            if backward is not None:
                backwards.setdefault((stage, backward), []).append(cycle)
    every = {(stage, m) for stage in range(s) for m in range(n)}
    assert set(forwards) == every and set(backwards) == every
    for stage, m in every:
        assert forwards[stage, m] == [m + stage]
        assert backwards[stage, m] == [m + 2 * (s - 1) - stage]
    # The last cycle is stage 0's backward of the last micro-batch.
    assert slots(0, s, n, cycle_count(s, n) - 1)[1] == n - 1


def test_slots_of_a_three_stage_pipeline_by_hand() -> None:
    """S = 3, N = 2: 2 + 2 x 2 = 6 cycles. The last stage (2) runs forward m and backward m in
    cycle m + 2; stage 0 runs forward m in cycle m and backward m in cycle m + 4."""
    table = [[slots(stage, 3, 2, t) for t in range(6)] for stage in range(3)]
    assert table[0] == [(0, None), (1, None), (None, None), (None, None), (None, 0), (None, 1)]
    assert table[1] == [(None, None), (0, None), (1, None), (None, 0), (None, 1), (None, None)]
    assert table[2] == [(None, None), (None, None), (0, 0), (1, 1), (None, None), (None, None)]


# ---- the schedule ----------------------------------------------------------------------------


def _stage(
    stage: int,
    forward: int,
    backward: int,
    update: int = 0,
    send: int = 0,
    returned: int = 0,
) -> StageCost:
    return StageCost(
        stage=stage,
        blocks=(f"block{stage}",),
        forward_cycles=forward,
        backward_cycles=backward,
        update_cycles=update,
        send_bytes=send,
        return_bytes=returned,
    )


@pytest.mark.parametrize("n", [1, 4, 8, 16])
def test_four_equal_stages_bubble(n: int) -> None:
    """S = 4, F = 100, B = 200 on every stage, nothing sent, no sync. Cycles 0..2 (S - 1 of
    them) run forwards only (F each: stage k's first backward is in cycle 6 - k >= 3); cycles
    3..N + 2 (N of them) have the last stage run a forward and a backward (F + B); cycles
    N + 3..N + 5 (S - 1) only backwards (B). So (S - 1) F + N (F + B) + (S - 1) B
    = (N + 3) x 300. The stages are busy 4 N x 300 of 4 (N + 3) x 300, so the bubble is
    3 / (N + 3): N = 1: 3/4; 4: 3/7; 8: 3/11; 16: 3/19."""
    f, b, s = 100, 200, 4
    stages = [_stage(k, f, b, update=10 * (k + 1)) for k in range(s)]
    cost = schedule_pipeline(stages, n, target(), sync_cycles=0)
    assert len(cost.cycles) == n + 2 * (s - 1)
    assert cost.cycles == (f,) * 3 + (f + b,) * n + (b,) * 3
    assert cost.pipeline_cycles == (n + s - 1) * (f + b)
    assert cost.busy_cycles == s * n * (f + b)
    assert cost.bubble_fraction == pytest.approx((s - 1) / (n + s - 1))
    assert cost.bubble_fraction == pytest.approx({1: 3 / 4, 4: 3 / 7, 8: 3 / 11, 16: 3 / 19}[n])
    # The update follows: the slowest stage's, 40 cycles.
    assert cost.update_cycles == 40
    assert cost.total_cycles == (n + 3) * 300 + 40
    assert cost.send_cycles == (0,) * len(cost.cycles)


def test_each_cycle_lasts_its_slowest_busy_stage() -> None:
    """S = 2, N = 2, F = (10, 30), B = (20, 50); 4 cycles. Stage 0: forward m in cycle m,
    backward m in m + 2; stage 1 both of m in cycle m + 1.
        cycle 0: stage 0 forward 0 (10)                           -> 10
        cycle 1: stage 0 forward 1 (10), stage 1 F+B of 0 (80)     -> 80
        cycle 2: stage 0 backward 0 (20), stage 1 F+B of 1 (80)    -> 80
        cycle 3: stage 0 backward 1 (20)                          -> 20
    190 in all; updates 5 and 7: 197. Busy 2 x 30 + 2 x 80 = 220 of 2 x 190: bubble 8/19."""
    stages = [_stage(0, 10, 20, update=5), _stage(1, 30, 50, update=7)]
    cost = schedule_pipeline(stages, 2, target(), sync_cycles=0)
    assert cost.cycles == (10, 80, 80, 20)
    assert cost.pipeline_cycles == 190
    assert cost.update_cycles == 7
    assert cost.total_cycles == 197
    assert cost.busy_cycles == 220
    assert cost.bubble_fraction == pytest.approx(8 / 19)


def test_sends_add_the_largest_send_once_per_cycle() -> None:
    """Bow sends at 70 GiB/s = 75,161,927,680 B/s over 1.85 GHz = 40.628 B per cycle, after
    3,000 idle cycles: 4,096 bytes take 3,000 + ceil(100.8) = 3,101 cycles, 2,048 bytes
    3,000 + ceil(50.4) = 3,051.
    S = 2, N = 2, F = (10, 30), B = (20, 50) as above; stage 0 sends 4,096 B forward after each
    forward, stage 1 returns 2,048 B after each backward (stage 0 returns nothing, the last
    stage sends nothing forward); sync 7 per cycle:
        cycle 0: 10 + send(4096) + 7         = 10 + 3101 + 7 = 3118
        cycle 1: 80 + max(send(4096), send(2048)) + 7 = 80 + 3101 + 7 = 3188
        cycle 2: 80 + send(2048) + 7         = 80 + 3051 + 7 = 3138
        cycle 3: 20 + 0 + 7                  = 27
    9,471 in all; then the slowest update, 250: 9,721."""
    bow = ipujax.Target.bow()
    rate = bow.pipeline_send_bytes_per_second / bow.clock_hz
    assert send_cycles(bow, 4096) == bow.pipeline_send_latency_cycles + math.ceil(4096 / rate)
    assert send_cycles(bow, 4096) == 3101
    assert send_cycles(bow, 2048) == 3051
    assert send_cycles(bow, 0) == 0
    stages = [
        _stage(0, 10, 20, update=100, send=4096, returned=999_999),
        _stage(1, 30, 50, update=250, send=999_999, returned=2048),
    ]
    cost = schedule_pipeline(stages, 2, bow, sync_cycles=7)
    assert cost.send_cycles == (3101, 3101, 3051, 0)
    assert cost.cycles == (3118, 3188, 3138, 27)
    assert cost.pipeline_cycles == 9471
    assert cost.update_cycles == 250
    assert cost.total_cycles == 9721


# ---- micro-batches in flight ------------------------------------------------------------------


def test_in_flight_by_hand() -> None:
    """S = 4: stage k holds a micro-batch from its forward (cycle m + k) to its backward
    (m + 6 - k), 7 - 2k cycles: 7, 5, 3, 1 micro-batches, at most N."""
    assert [in_flight(k, 4, 16) for k in range(4)] == [7, 5, 3, 1]
    assert [in_flight(k, 4, 4) for k in range(4)] == [4, 4, 3, 1]
    assert [in_flight(k, 4, 1) for k in range(4)] == [1, 1, 1, 1]
    assert in_flight(0, 1, 8) == 1


@given(st.integers(1, 6), st.integers(1, 20), st.data())
def test_in_flight_is_the_most_microbatches_between_forward_and_backward(
    s: int, n: int, data: st.DataObject
) -> None:
    """From the slots: micro-batch m is in flight on stage k in cycles m + k ..
    m + 2 (S - 1) - k; the most at once is min(N, 2 (S - 1 - k) + 1)."""
    stage = data.draw(st.integers(0, s - 1))
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for t in range(cycle_count(s, n)):
        forward, backward = slots(stage, s, n, t)
        if forward is not None:
            first[forward] = t
        if backward is not None:
            last[backward] = t
    most = max(sum(first[m] <= t <= last[m] for m in range(n)) for t in range(cycle_count(s, n)))
    assert in_flight(stage, s, n) == most == min(n, 2 * (s - 1 - stage) + 1)


# ---- balanced stages --------------------------------------------------------------------------


def test_balanced_stages_by_hand() -> None:
    """Weights 1, 2, 3, 4, 5 into 2 runs: cuts give max(1, 14), max(3, 12), max(6, 9),
    max(10, 5): the third, [a b c] [d e], 9. Into 3: [a b c] [d] [e] has 6, 4, 5: 6, and no
    cut does better (e alone is 5; d + e = 9; a..c = 6 must then share)."""
    blocks = list("abcde")
    assert balanced_stages(blocks, [1, 2, 3, 4, 5], 2) == [["a", "b", "c"], ["d", "e"]]
    assert balanced_stages(blocks, [1, 2, 3, 4, 5], 3) == [["a", "b", "c"], ["d"], ["e"]]
    assert balanced_stages(blocks, [1, 2, 3, 4, 5], 5) == [[b] for b in blocks]
    assert balanced_stages(blocks, [1, 2, 3, 4, 5], 1) == [blocks]


def _brute_force(weights: list[int], count: int) -> int:
    """The least largest run over every way of cutting into `count` contiguous runs."""
    n = len(weights)
    best = None
    for cuts in itertools.combinations(range(1, n), count - 1):
        edges = (0, *cuts, n)
        worst = max(sum(weights[a:b]) for a, b in itertools.pairwise(edges))
        best = worst if best is None else min(best, worst)
    assert best is not None
    return best


@given(st.lists(st.integers(0, 50), min_size=1, max_size=8), st.data())
def test_balanced_stages_against_brute_force(weights: list[int], data: st.DataObject) -> None:
    count = data.draw(st.integers(1, len(weights)))
    blocks = [f"b{i}" for i in range(len(weights))]
    runs = balanced_stages(blocks, weights, count)
    assert len(runs) == count
    assert all(runs)  # non-empty
    assert [b for run in runs for b in run] == blocks  # contiguous, in order, each once
    weight = dict(zip(blocks, weights, strict=True))
    largest = max(sum(weight[b] for b in run) for run in runs)
    assert largest == _brute_force(weights, count)


# ---- which ops run once per micro-batch -------------------------------------------------------


def _step(params: dict[str, jax.Array], batch: tuple[jax.Array, jax.Array]) -> tuple:
    """A two-layer MLP's SGD step: the loss is the mean over the batch."""
    x, y = batch

    def loss(p: dict[str, jax.Array]) -> jax.Array:
        with jax.named_scope("l1"):
            h = jnp.tanh(x @ p["w1"])
        with jax.named_scope("l2"):
            out = h @ p["w2"]
        return jnp.mean((out - y) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return value, jax.tree.map(lambda w, g: w - 0.1 * g, params, grads)


def _args(rows: int = 8) -> tuple[dict[str, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    params = {
        "w1": rng.normal(size=(4, 8)).astype(np.float32),
        "w2": rng.normal(size=(8, 3)).astype(np.float32),
    }
    batch = (
        rng.normal(size=(rows, 4)).astype(np.float32),
        rng.normal(size=(rows, 3)).astype(np.float32),
    )
    return params, batch


def _graph() -> Graph:
    return lower(_step, *_args())


def _dot_generals(graph: Graph) -> list[Op]:
    return [op for op in graph.ops if op.name == "dot_general"]


def test_forward_and_backward_run_per_microbatch_the_update_once() -> None:
    """Flat inputs: params' w1, w2 (0, 1), then the batch's x, y (2, 3): the batch inputs are
    2 and 3. The two forward matmuls (x @ w1, h @ w2) and the backward's three (the gradient
    into h, and the weights' gradients h^T d, x^T d) all read the batch; the SGD update
    w - 0.1 g reads the weights' gradients, summed over the batch and so over the
    micro-batches: it runs once per step, after the accumulation."""
    graph = _graph()
    assert [v.shape for v in graph.inputs] == [(4, 8), (8, 3), (8, 4), (8, 3)]
    each = dict(zip(graph.ops, per_microbatch(graph, [2, 3]), strict=True))
    dots = _dot_generals(graph)
    forward = [op for op in dots if "transpose(" not in op.loc.scope]
    backward = [op for op in dots if "transpose(" in op.loc.scope]
    assert len(forward) == 2 and len(backward) >= 2
    assert all(each[op] for op in dots)
    weights = set(graph.inputs[:2])
    updates = [op for op in graph.ops if op.name == "subtract" and weights & set(op.operands)]
    assert len(updates) == 2  # w1 - 0.1 g1, w2 - 0.1 g2
    assert not any(each[op] for op in updates)
    # What they subtract, 0.1 x g, is made once per step too.
    made_by = {v: op for op in graph.ops for v in op.results}
    scaled = [made_by[v] for op in updates for v in op.operands if v not in weights]
    assert [op.name for op in scaled] == ["multiply", "multiply"]
    assert not any(each[op] for op in scaled)
    # The mean loss divides the sum over the batch: that sum is accumulated, so the division
    # runs once per step.
    (loss,) = [made_by[v] for v in graph.outputs[:1]]
    assert loss.name == "divide" and not each[loss]


def test_nothing_runs_per_microbatch_without_batch_inputs() -> None:
    graph = _graph()
    assert not any(per_microbatch(graph, []))


# ---- errors ------------------------------------------------------------------------------------


def test_pipeline_needs_a_mesh_axis() -> None:
    with pytest.raises(ipujax.ConfigError, match=r"Pipeline\(axis=''\): name a mesh axis"):
        ipujax.Pipeline(axis="")


@pytest.mark.parametrize(
    ("microbatches", "message"),
    [
        (0, r"Pipeline\(microbatches=0\): give at least 1 micro-batch"),
        (1.5, r"Pipeline\(microbatches=1.5\): give a positive integer"),
        (True, r"Pipeline\(microbatches=True\): give a positive integer"),
    ],
)
def test_pipeline_needs_a_whole_number_of_microbatches(microbatches: object, message: str) -> None:
    with pytest.raises(ipujax.ConfigError, match=message):
        ipujax.Pipeline("pp", microbatches=microbatches)  # type: ignore[arg-type]


@pytest.mark.parametrize("stages", ["x", [], ()])
def test_pipeline_stages_are_auto_or_a_list(stages: object) -> None:
    with pytest.raises(ipujax.ConfigError, match=r"give 'auto' or one entry per stage"):
        ipujax.Pipeline("pp", stages=stages)


def test_a_stage_entry_names_scopes() -> None:
    with pytest.raises(ipujax.ConfigError, match=r"stage \[\] is not a scope name"):
        ipujax.Pipeline("pp", stages=[["l1"], []])


def _compile(mesh: ipujax.Mesh, pipeline: ipujax.Pipeline, rows: int = 8) -> ipujax.Compiled:
    jitted = ipujax.jit(_step, mesh=mesh, pipeline=pipeline)
    return jitted.lower(*_args(rows)).compile()


def test_the_mesh_must_have_the_pipeline_axis() -> None:
    mesh = ipujax.make_mesh((2,), ("dp",), target=target(16))
    with pytest.raises(ipujax.ConfigError, match=r"the mesh has axes \['dp'\]"):
        _compile(mesh, ipujax.Pipeline("pp", microbatches=2))


def test_one_stage_per_ipu_of_the_axis() -> None:
    mesh = ipujax.make_mesh((2,), ("pp",), target=target(16))
    pipeline = ipujax.Pipeline("pp", stages=["l1", "l2", "l1"], microbatches=2)
    with pytest.raises(
        ipujax.ConfigError, match=r"names 3 stages, but the mesh axis 'pp' has 2 IPUs"
    ):
        _compile(mesh, pipeline)


def test_stages_given_must_follow_the_model() -> None:
    # Stages named backwards send l1's activations up from stage 1 to l2 on stage 0, which a
    # pipeline's schedule never does: refused, where it was costed (and cheaper).
    mesh = ipujax.make_mesh((2,), ("pp",), target=target(16))
    _compile(mesh, ipujax.Pipeline("pp", stages=["l1", "l2"], microbatches=2))
    with pytest.raises(ipujax.ConfigError, match=r"l2 on stage 0 reads what l1 makes on stage 1"):
        _compile(mesh, ipujax.Pipeline("pp", stages=["l2", "l1"], microbatches=2))


def test_auto_needs_as_many_scopes_as_stages() -> None:
    mesh = ipujax.make_mesh((4,), ("pp",), target=target(16))
    with pytest.raises(
        ipujax.ConfigError, match=r"found 2 jax.named_scope blocks \(l1, l2\) for 4 stages"
    ):
        _compile(mesh, ipujax.Pipeline("pp", microbatches=2))


def test_the_batch_must_split_into_microbatches() -> None:
    """8 rows do not split into 3 micro-batches (nor 6 into 4)."""
    mesh = ipujax.make_mesh((2,), ("pp",), target=target(16))
    with pytest.raises(
        ipujax.ConfigError, match=r"has 8 rows .* which do not split into 3 micro-batches"
    ):
        ipujax.jit(_step, mesh=mesh, pipeline=ipujax.Pipeline("pp", microbatches=3)).lower(
            *_args(8)
        )
    with pytest.raises(ipujax.ConfigError, match=r"do not split into 4 micro-batches"):
        ipujax.jit(_step, mesh=mesh, pipeline=ipujax.Pipeline("pp", microbatches=4)).lower(
            *_args(6)
        )

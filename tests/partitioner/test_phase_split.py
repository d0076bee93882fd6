"""How programs split into phases: cuts where the fewest bytes cross, derived by hand on a small
chain; blocks found from the program's own scopes; a scope used twice in a row of work falls back
to one phase per contiguous run."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ipujax
from lowering import Op, Value
from partitioner.phases.cuts import min_crossing_cuts
from partitioner.phases.scopes import scope_blocks
from partitioner.phases.split import split_auto
from partitioner.program import Task


def _value(i: int, nbytes: int) -> Value:
    return Value(i, (nbytes,), np.dtype(np.uint8))


def _task(reads: list[Value], makes: Value) -> Task:
    op = Op("add", tuple(reads), (makes,))
    return Task(op, tuple(reads), (), (), lambda *a: a)


def _chain() -> list[Task]:
    """t0: w0 (100 B) -> a (1,000 B); t1: a -> b (10 B); t2: b, w1 (100 B) -> c (1,000 B);
    t3: c -> d (10 B). A boundary before t1 carries a (1,000 B), before t2 b (10 B), before t3
    c (1,000 B); all four tasks touch 2,220 B."""
    w0, a, b, w1, c, d = (_value(i, n) for i, n in enumerate((100, 1000, 10, 100, 1000, 10)))
    return [_task([w0], a), _task([a], b), _task([b, w1], c), _task([c], d)]


def test_the_cut_goes_where_the_fewest_bytes_cross() -> None:
    tasks = _chain()
    # [t0, t1] touch w0, a, b: 1,110 B; [t2, t3] touch b, w1, c, d: 1,120 B.
    assert min_crossing_cuts(tasks, budget=1300, penalty=0, views=set()) == [2]
    assert min_crossing_cuts(tasks, budget=5000, penalty=0, views=set()) == []
    # Within 1,100 B no run of two tasks fits, but t1 and t2 alone do; three cuts.
    assert min_crossing_cuts(tasks, budget=1100, penalty=0, views=set()) == [1, 2, 3]


def test_a_penalty_per_cut_is_paid_only_when_the_budget_demands() -> None:
    tasks = _chain()
    assert min_crossing_cuts(tasks, budget=1300, penalty=10**6, views=set()) == [2]


def _blocks(x, w):
    for i in range(2):
        with jax.named_scope(f"block{i}"):
            x = jnp.tanh(x @ w)
    with jax.named_scope("head"):
        return x.sum()


def test_auto_finds_the_programs_own_scopes() -> None:
    x = jax.ShapeDtypeStruct((8, 64), jnp.float32)
    w = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    mesh = ipujax.make_mesh((1,), ("ipu",), target=ipujax.Target.bow().with_tiles(16))
    compiled = ipujax.jit(jax.grad(_blocks), mesh=mesh, phases="auto").lower(x, w).compile()
    assert scope_blocks(compiled.program) == ["block0", "block1", "head"]
    names = [p.name for p in compiled.cost_report().phases]
    # The gradient needs no forward value of the head's sum: its forward phase has no work.
    assert names == [
        "block0",
        "block1",
        "head (backward)",
        "block1 (backward)",
        "block0 (backward)",
    ]


def _reused(x, w):
    """The same scope name for the first and the last layer: one phase for both would run the
    last layer before the middle one it reads."""
    for name in ("shared", "middle", "shared"):
        with jax.named_scope(name):
            x = jnp.tanh(x @ w)
    return x


def test_a_reused_scope_gets_a_phase_per_run() -> None:
    x = np.ones((8, 64), np.float32)
    w = np.full((64, 64), 0.01, np.float32)
    mesh = ipujax.make_mesh((1,), ("ipu",), target=ipujax.Target.bow().with_tiles(16))
    compiled = ipujax.jit(_reused, mesh=mesh, phases=["shared", "middle"]).lower(x, w).compile()
    names = [p.name for p in compiled.cost_report().phases]
    assert names == ["shared [1]", "middle", "shared [2]"]
    np.testing.assert_allclose(compiled(x, w), jax.jit(_reused)(x, w), rtol=1e-6)


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")  # about the cuts
def test_without_scopes_auto_cuts_by_bytes() -> None:
    """No named scope at all: the cut finds the narrow points of a chain of wide layers."""

    def wide(x, ws):
        for w in ws:
            x = jnp.tanh(x @ w)
        return x

    ws = [jax.ShapeDtypeStruct((512, 512), jnp.float32) for _ in range(8)]
    x = jax.ShapeDtypeStruct((8, 512), jnp.float32)
    target = dataclasses.replace(ipujax.Target.bow().with_tiles(16), io_tiles=0)
    mesh = ipujax.make_mesh((1,), ("ipu",), target=target)
    compiled = ipujax.jit(wide, mesh=mesh, phases="auto").lower(x, ws).compile()
    program = compiled.program
    assert scope_blocks(program) == []
    _, plan = split_auto(program, target)
    assert len(plan.names) > 1 and plan.names[0] == "phase 0"
    # Each boundary passes only the small activation [8, 512] forward, never a weight.
    report = compiled.cost_report()
    assert all(p.store_bytes <= 8 * 512 * 4 for p in report.phases[:-1])


def _two_matmuls(x, w1, v, w2):
    with jax.named_scope("layer"):
        return jnp.tanh(x @ w1).sum() + (v @ w2).sum()


def _matmuls(mem: int) -> list[tuple[int, int]]:
    """Each matmul's temporary bytes per tile and compute cycles, phased on a 16-tile Bow whose
    tiles hold `mem` bytes."""
    target = dataclasses.replace(ipujax.Target.bow().with_tiles(16), io_tiles=0, bytes_per_tile=mem)
    mesh = ipujax.make_mesh((1,), ("ipu",), target=target)
    shapes = [(64, 512), (512, 512), (16, 64), (64, 16)]
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    compiled = ipujax.jit(_two_matmuls, mesh=mesh, phases="auto").lower(*args).compile()
    assert compiled.cost_report().fits
    return [
        (
            sum(t.bytes_per_tile for t in task.temporaries),
            sum(s.compute_cycles for s in task.supersteps),
        )
        for task in compiled.program.tasks
        if task.op.name == "dot_general"
    ]


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")
def test_fitting_replans_only_the_matmuls_the_peak_reaches() -> None:
    """A phase over budget at its large matmul: that matmul is planned with less temporary
    memory, and the small one, far below the budget while it runs, keeps its plan (asked to
    shed the phase's whole excess, it went from 832 to 14,400 cycles for nothing)."""
    (big_roomy, small_roomy), (big_tight, small_tight) = _matmuls(638_976), _matmuls(120_000)
    assert big_tight[0] < big_roomy[0] and big_tight[1] > big_roomy[1]
    assert small_tight == small_roomy

"""Which layout an elementwise result takes, and matmul plans that use every tile."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from helpers import target

import ipujax
from partitioner.tiles.matmul_plan import plan_matmul

F32 = np.dtype(np.float32)


def _tasks(fun, *args, tiles: int = 16) -> dict:
    mesh = ipujax.make_mesh((1,), ("ipu",), target=ipujax.Target.bow().with_tiles(tiles))
    # op by op: the layouts each op takes are the subject here
    compiled = ipujax.jit(fun, mesh=mesh, fuse=False).lower(*args).compile()
    out = compiled(*args)
    np.testing.assert_allclose(out, jax.jit(fun)(*args), rtol=1e-6)
    return {task.op.name: task for task in compiled.program.tasks}


def test_elementwise_after_a_matmul_keeps_the_matmul_layout() -> None:
    """`0.5 * (x @ w)`: jax puts the broadcast constant first, but PopLibs never clones a
    broadcast's layout while another operand has one: the matmul's result stays where it is and
    each tile receives only the broadcast's source, one f32 scalar."""
    x = np.linspace(-1, 1, 64 * 48, dtype=np.float32).reshape(64, 48)
    w = np.linspace(1, 2, 48 * 32, dtype=np.float32).reshape(48, 32)
    tasks = _tasks(lambda x, w: 0.5 * (x @ w), x, w)
    (matmul_layout,) = tasks["dot_general"].result_layouts
    assert tasks["multiply"].result_layouts == (matmul_layout,)
    (step,) = tasks["multiply"].supersteps
    assert step.busiest_tile_bytes == 4
    assert step.exchange_bytes == 4 * matmul_layout.tiles


def test_of_two_computed_operands_the_more_even_spread_wins() -> None:
    """y (a matmul's grid, 16 tiles) + z (linear): the result takes whichever layout puts
    fewer elements on its fullest tile."""
    x = np.ones((64, 48), np.float32)
    w = np.ones((48, 32), np.float32)
    z = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    tasks = _tasks(lambda x, w, z: (x @ w) + jnp.sin(z), x, w, z)
    grid = tasks["dot_general"].result_layouts[0]
    linear = tasks["sine"].result_layouts[0]
    best = min((grid, linear), key=lambda lay: (lay.block_elements, -lay.tiles))
    assert tasks["add"].result_layouts == (best,)


def test_a_plan_stretches_into_tiles_a_power_of_two_grid_leaves_idle() -> None:
    # On 24 tiles the best power-of-two grid of a 1x96x96x32 matmul is 16 tiles; splitting
    # the rows 24 ways (blocks of 4 rows) as well is faster, as PopLibs' uneven splits are.
    t = target(24)
    plan = plan_matmul(1, 96, 96, 32, F32, 4, t)
    assert 16 < plan.tiles <= 24
    sixteen = plan_matmul(1, 96, 96, 32, F32, 4, target(16))
    assert sixteen.tiles == 16
    assert plan.cycles < sixteen.cycles


def test_a_stretched_plan_runs_like_jax() -> None:
    x = np.linspace(-1, 1, 96 * 32, dtype=np.float32).reshape(96, 32)
    w = np.linspace(1, 2, 32 * 96, dtype=np.float32).reshape(32, 96)
    tasks = _tasks(lambda x, w: x @ w, x, w, tiles=24)
    assert tasks["dot_general"].supersteps[0].tiles > 16


def test_a_reshape_of_a_matmuls_result_is_a_view() -> None:
    """A reshape keeps the row-major order and a layout's view is a row-major reshape of its
    tensor, so `(x @ w).reshape(...)` stays on the matmul's tiles: no superstep, no storage."""
    x = np.ones((64, 48), np.float32)
    w = np.ones((48, 32), np.float32)
    tasks = _tasks(lambda x, w: jnp.sin((x @ w).reshape(8, 8, 32)), x, w)
    grid = tasks["dot_general"].result_layouts[0]
    reshape = tasks["reshape"]
    assert reshape.supersteps == ()
    assert reshape.aliases == (0,)
    (out,) = reshape.result_layouts
    assert (out.view, out.grid, out.start) == (grid.view, grid.grid, grid.start)
    assert tasks["sine"].supersteps[0].busiest_tile_bytes == 0

"""The tiny GPT's AdamW training step (examples/tiny_gpt.py) on the virtual IPU equals jax.jit."""

from __future__ import annotations

import os
import sys
from typing import Any

import jax
import numpy as np
import pytest
from helpers import assert_trees_close, mesh

import ipujax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import tiny_gpt


@pytest.fixture(scope="module")
def example() -> tuple[Any, Any, Any]:
    return tiny_gpt.example()


@pytest.fixture(scope="module")
def expected(example: tuple[Any, Any, Any]) -> Any:
    return jax.jit(tiny_gpt.train_step)(*example)


@pytest.fixture(scope="module", params=[16, 1472], ids=["16-tiles", "bow"])
def compiled(request: pytest.FixtureRequest, example: tuple[Any, Any, Any]) -> ipujax.Compiled:
    jitted = ipujax.jit(tiny_gpt.train_step, mesh=mesh(request.param))
    return jitted.lower(*example).compile()


def test_example_is_the_two_layer_model(example: tuple[Any, Any, Any]) -> None:
    params, _, tokens = example
    assert len(params["blocks"]) == 2
    assert tokens.shape == (4, 17)


# AdamW's first step moves a weight by about lr x g / (|g| + eps), eps = 1e-8: where a gradient
# is itself ~1e-8 (it is -6.0e-9 for blocks[1].qkv[17, 39]), summing the same f32 products in
# another order (tiles split K; XLA does not) shifts it by ~3e-11 and the weight by ~1.1e-6.
# The updated weights therefore get 2e-6 absolute; the gradients themselves, the optimiser state
# and the loss are held to rtol 1e-5, atol 1e-6.
PARAMS_ATOL = 2e-6


def test_train_step_equals_jax_jit(
    compiled: ipujax.Compiled, example: tuple[Any, Any, Any], expected: Any
) -> None:
    ours = compiled(*example)
    assert jax.tree.structure(ours) == jax.tree.structure(expected)
    (new_params, opt_state, loss), (want_params, want_state, want_loss) = ours, expected
    assert_trees_close(loss, want_loss, rtol=1e-5, atol=1e-6)
    assert_trees_close(opt_state, want_state, rtol=1e-5, atol=1e-6)
    assert_trees_close(new_params, want_params, rtol=1e-5, atol=PARAMS_ATOL)
    assert np.isfinite(float(loss))
    # The step changed the weights (a step that returned its inputs would fail here).
    old = jax.tree.leaves(example[0])
    assert any(
        not np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(jax.tree.leaves(new_params), old, strict=True)
    )


@pytest.mark.parametrize("tiles", [16, 1472])
def test_loss_and_gradients_equal_jax_jit(tiles: int, example: tuple[Any, Any, Any]) -> None:
    params, _, tokens = example
    step = jax.value_and_grad(tiny_gpt.loss_fn)
    ours = ipujax.jit(step, mesh=mesh(tiles))(params, tokens)
    assert_trees_close(ours, jax.jit(step)(params, tokens), rtol=1e-5, atol=1e-6)


def test_train_step_report(compiled: ipujax.Compiled) -> None:
    report = compiled.cost_report()
    assert report.total_cycles > 0
    assert report.fits
    assert report.peak_tile_bytes <= 638_976
    ops = dict(report.cycles_by_op())
    assert "dot_general" in ops
    assert ops["dot_general"] > 0
    assert report.flops > 0
    assert report.tile_memory.shape == (1, compiled.mesh.target.tiles_per_ipu)


def test_more_tiles_take_fewer_cycles(example: tuple[Any, Any, Any]) -> None:
    # The same step spread over 1,472 tiles instead of 16 must be faster in the model.
    cycles = {
        tiles: ipujax.jit(tiny_gpt.train_step, mesh=mesh(tiles))
        .lower(*example)
        .compile()
        .cost_report()
        .total_cycles
        for tiles in (16, 1472)
    }
    assert cycles[1472] < cycles[16]

"""`Pipeline(stages="auto")` over a flax linen model written as people write one: eight blocks
with no `jax.named_scope` of the user's (linen names none), found from the program's structure
and cut into four stages balanced by their cycles."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import numpy as np
import optax

import ipujax

D, BLOCKS, CLASSES = 64, 8, 10
TX = optax.sgd(1e-2)


class Block(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = nn.Dense(4 * D)(nn.LayerNorm()(x))
        return x + nn.Dense(D)(nn.gelu(h))


class Model(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Dense(D)(x)
        for _ in range(BLOCKS):
            x = Block()(x)
        return nn.Dense(CLASSES)(x)


def _step(params: Any, opt: Any, batch: tuple[jax.Array, jax.Array]) -> tuple[Any, Any, Any]:
    x, y = batch

    def loss_fn(p: Any) -> jax.Array:
        logits = Model().apply({"params": p}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt = TX.update(grads, opt, params)
    return optax.apply_updates(params, updates), opt, loss


def test_eight_linen_blocks_on_four_balanced_stages() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 16)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=(32,)).astype(np.int32)
    params = Model().init(jax.random.key(0), x)["params"]
    opt = TX.init(params)
    pipeline = ipujax.Pipeline(axis="pp", stages="auto", microbatches=4)
    mesh = ipujax.make_mesh((4,), ("pp",), target=ipujax.Target.bow().with_tiles(64))
    compiled = ipujax.jit(_step, mesh=mesh, pipeline=pipeline).lower(params, opt, (x, y)).compile()
    got = compiled(params, opt, (x, y))
    want = jax.jit(_step)(params, opt, (x, y))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    stages = compiled.cost_report().stages
    assert [len(s.blocks) for s in stages] != [1, 1, 1, 7]  # the blocks are spread
    assert sum(len(s.blocks) for s in stages) == BLOCKS + 2  # with the prologue and epilogue
    per_microbatch = [s.forward_cycles + s.backward_cycles for s in stages]
    assert max(per_microbatch) <= 1.6 * min(per_microbatch)

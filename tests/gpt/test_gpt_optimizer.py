"""The GPT example's optimizer: AdamW decays the weights and embeddings only."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax


def test_weight_decay_spares_biases_and_layer_norms(gpt: SimpleNamespace) -> None:
    config = gpt.model.Config(layers=1, d_model=32, heads=4, seq=16)
    params = jax.tree.map(jnp.ones_like, gpt.model.init(jax.random.key(0), config))
    optimizer = gpt.model.make_optimizer(lr=0.1, warmup=1, weight_decay=0.5, clip=0.0)
    state = optimizer.init(params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    for _ in range(2):  # the first step's learning rate is the warm-up's 0
        updates, state = optimizer.update(zeros, state, params)
        params = optax.apply_updates(params, updates)
    # With zero gradients only the decay moves a parameter: by lr x decay = 5%.
    changed = {
        jax.tree_util.keystr(path): not np.allclose(leaf, 1.0)
        for path, leaf in jax.tree_util.tree_leaves_with_path(params)
    }
    decayed = {name for name, moved in changed.items() if moved}
    assert decayed == {name for name in changed if name.split("'")[-2].startswith("w")}
    assert "['blocks'][0]['attn']['bqkv']" not in decayed  # 3-D, but a bias
    assert {"['wte']", "['wpe']", "['blocks'][0]['attn']['wqkv']"} <= decayed
    np.testing.assert_allclose(params["wte"], 0.95, rtol=1e-6)

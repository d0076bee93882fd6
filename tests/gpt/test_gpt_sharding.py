"""sharding.py: the PartitionSpecs of data parallelism, Megatron 1D and PopXL-style 2D."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import jax
import pytest
from jax.sharding import PartitionSpec as P

import ipujax


def mesh(**axes: int) -> ipujax.Mesh:
    return ipujax.make_mesh(tuple(axes.values()), tuple(axes))


@pytest.fixture(scope="module")
def state(gpt: SimpleNamespace) -> tuple[Any, Any]:
    config = gpt.model.Config(layers=2, d_model=32, heads=4, seq=16)
    params = jax.eval_shape(lambda: gpt.model.init(jax.random.key(0), config))
    return params, jax.eval_shape(gpt.model.make_optimizer().init, params)


def axes_of(specs: Any) -> set[str]:
    found: set[str] = set()
    for spec in jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P)):
        for entry in spec:
            found.update(entry if isinstance(entry, tuple) else [entry] if entry else [])
    return found


def test_strategy_follows_the_axis_names(gpt: SimpleNamespace) -> None:
    sharding = gpt.sharding
    assert sharding.strategy(mesh(ipu=1)) == "dp"
    assert sharding.strategy(mesh(dp=4)) == "dp"
    assert sharding.strategy(mesh(dp=2, tp=2)) == "1d"
    assert sharding.strategy(mesh(tp=4)) == "1d"
    assert sharding.strategy(mesh(dp=2, tp1=2, tp2=2)) == "2d"
    for bad in (mesh(tp=2, tp1=2, tp2=1), mesh(tp1=2), mesh(dp=2, ep=2)):
        with pytest.raises(ValueError):
            sharding.strategy(bad)


def test_batch_spec(gpt: SimpleNamespace) -> None:
    assert gpt.sharding.batch_spec(mesh(dp=2, tp=2)) == P("dp", None)
    assert gpt.sharding.batch_spec(mesh(tp=2)) == P(None, None)


def test_data_parallel_replicates_every_weight(gpt: SimpleNamespace, state: Any) -> None:
    params, _ = state
    specs = gpt.sharding.param_specs(params, mesh(dp=4))
    assert axes_of(specs) == set()
    assert jax.tree.structure(specs, is_leaf=lambda x: isinstance(x, P)) == jax.tree.structure(
        params
    )


def test_megatron_1d(gpt: SimpleNamespace, state: Any) -> None:
    params, _ = state
    specs = gpt.sharding.param_specs(params, mesh(dp=2, tp=2))
    assert axes_of(specs) == {"tp"}  # dp never splits a weight
    block = specs["blocks"][1]
    # Column-parallel: q, k, v by heads, FFN-in by d_ff; row-parallel: out-projection, FFN-out.
    assert block["attn"]["wqkv"] == P(None, "tp", None, None)  # [d, heads, 3, head_dim]
    assert block["attn"]["bqkv"] == P("tp", None, None)
    assert block["attn"]["wo"] == P("tp", None, None)  # [heads, head_dim, d]
    assert block["attn"]["bo"] == P(None)
    assert block["mlp"]["w_in"] == P(None, "tp")
    assert block["mlp"]["b_in"] == P("tp")
    assert block["mlp"]["w_out"] == P("tp", None)
    assert block["ln1"]["scale"] == P(None)
    assert specs["wte"] == P("tp", None)  # vocab-parallel embedding and LM head


def test_popxl_2d(gpt: SimpleNamespace, state: Any) -> None:
    params, _ = state
    specs = gpt.sharding.param_specs(params, mesh(dp=2, tp1=2, tp2=2))
    assert axes_of(specs) == {"tp1", "tp2"}
    block = specs["blocks"][0]
    # QKV and FFN-in [h/tp2, k h/tp1]; out-projection and FFN-out [k h/tp1, h/tp2].
    assert block["attn"]["wqkv"] == P("tp2", "tp1", None, None)
    assert block["mlp"]["w_in"] == P("tp2", "tp1")
    assert block["attn"]["wo"] == P("tp1", None, "tp2")
    assert block["mlp"]["w_out"] == P("tp1", "tp2")
    # The residual stream is [T, h/tp2]: LayerNorms, biases added to it and embeddings too.
    assert block["ln2"] == {"scale": P("tp2"), "bias": P("tp2")}
    assert block["mlp"]["b_out"] == P("tp2")
    assert specs["wpe"] == P(None, "tp2")
    assert specs["wte"] == P("tp1", "tp2")


def test_optimizer_state_mirrors_the_params(gpt: SimpleNamespace, state: Any) -> None:
    params, opt_state = state
    m = mesh(dp=2, tp1=2, tp2=2)
    pspecs, sspecs, batch = gpt.sharding.train_specs(params, opt_state, m)
    is_spec = lambda x: isinstance(x, P)  # noqa: E731
    # One spec per leaf of the optimizer state, in the same structure.
    assert jax.tree.structure(sspecs, is_leaf=is_spec) == jax.tree.structure(opt_state)
    adam = opt_state[1][0]  # chain(clip, adamw): adamw's first part is scale_by_adam
    adam_specs = sspecs[1][0]
    assert adam_specs.mu == pspecs and adam_specs.nu == pspecs
    assert adam_specs.count == P()
    assert adam.count.shape == ()
    assert batch == P("dp", None)


def test_heads_must_divide(gpt: SimpleNamespace) -> None:
    gpt.sharding.check_divisible(mesh(tp1=4, tp2=2), 8)
    with pytest.raises(ValueError, match="heads"):
        gpt.sharding.check_divisible(mesh(dp=2, tp=3), 4)

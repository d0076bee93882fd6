"""The BERT example: the tiny model's MLM loss and LAMB step under ipujax.jit equal jax.jit's on
one IPU and on dp x tp; the model's MLM head, weight decay and dtypes; the cost-report
factories (shapes only, shardings and pipelining from the mesh's axis names, parameter counts);
and train.py run in-process through `main(argv)`."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    assert_trees_close,
    keyword_defaults,
    printed_losses,
    run_train,
    skew_reference,
    usage_error,
)
from jax.sharding import PartitionSpec as P
from shared.transformer import decay_mask

import ipujax

FACTORIES = ["tiny", "bert_base", "bert_large"]
is_spec = lambda x: isinstance(x, P)  # noqa: E731


def structure(tree: Any) -> Any:
    """A tree's structure, PartitionSpecs as leaves."""
    return jax.tree.structure(tree, is_leaf=is_spec)


def spec_axes(specs: Any) -> set[str]:
    """Every mesh axis named by a tree of PartitionSpecs."""
    axes: set[str] = set()
    for spec in jax.tree.leaves(specs, is_leaf=is_spec):
        for entry in spec:
            axes.update((entry,) if isinstance(entry, str) else entry or ())
    return axes


# ---- the tiny model's step against jax.jit -------------------------------------------------


@pytest.mark.parametrize("shape", [None, (2, 2)], ids=["one-ipu", "dp2-tp2"])
def test_tiny_step_equals_jax_jit(bert: SimpleNamespace, shape: tuple[int, int] | None) -> None:
    mesh = None if shape is None else ipujax.make_mesh(shape, ("dp", "tp"))
    fun, args, jit_kwargs = bert.workloads.tiny(mesh=mesh)
    compiled = ipujax.jit(fun, **jit_kwargs).lower(*args).compile()
    got, want = compiled(*args), jax.jit(fun)(*args)
    assert 3.0 < float(want[2]) < 6.0  # about log(128) for a fresh model
    assert_trees_close(got, want, rtol=1e-5, atol=1e-6)  # loss, new params and LAMB state
    moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), got[0], args[0])
    assert all(jax.tree.leaves(moved))  # the step changed every parameter
    if mesh is not None:  # Megatron's AllReduces over tp, the gradients' over dp
        assert {("tp",), ("dp",)} <= {c.axes for c in compiled.cost_report().collectives}


@pytest.mark.parametrize("shape", [(4,), (2, 4)], ids=["pp4", "dp2-pp4"])
def test_four_stage_pipelined_step_equals_jax_jit(
    bert: SimpleNamespace, shape: tuple[int, ...]
) -> None:
    """Pipelining reorders work and never changes it: a 4-stage pipeline over 2 micro-batches
    returns jax.jit's whole-batch step, and its report has the 4 stages and N + 2 (4 - 1)
    pipeline cycles."""
    names = ("pp",) if len(shape) == 1 else ("dp", "pp")
    mesh = ipujax.make_mesh(shape, names)
    fun, args, jit_kwargs = bert.workloads.tiny(mesh=mesh, microbatches=2)
    assert jit_kwargs["pipeline"].microbatches == 2
    compiled = ipujax.jit(fun, **jit_kwargs).lower(*args).compile()
    assert_trees_close(compiled(*args), jax.jit(fun)(*args), rtol=1e-5, atol=1e-6)
    report = compiled.cost_report()
    assert len(report.stages) == 4 and report.microbatches == 2
    assert len(report.pipeline_cycles) == 2 + 2 * 3
    blocks = [b for stage in report.stages for b in stage.blocks]
    assert blocks[0] == "embed" and "layer1" in blocks  # every block, in order, on a stage


# ---- the model ---------------------------------------------------------------------------------


def test_mlm_head_runs_on_the_masked_positions(bert: SimpleNamespace) -> None:
    model, config = bert.model, bert.workloads.TINY
    params = model.init(jax.random.key(1), config)
    tokens, positions, labels = bert.workloads.random_batch(config, 3, np.random.default_rng(1))
    everywhere = model.forward(params, tokens)
    masked = model.forward(params, tokens, positions)
    assert everywhere.shape == (3, config.seq, config.vocab)
    assert masked.shape == (3, config.mask_tokens, config.vocab)
    gathered = np.take_along_axis(np.asarray(everywhere), positions[..., None], axis=1)
    np.testing.assert_allclose(masked, gathered, rtol=1e-5, atol=1e-6)
    log_p = np.asarray(jax.nn.log_softmax(masked, axis=-1))
    want = -np.mean(np.take_along_axis(log_p, labels[..., None], axis=-1))
    loss = model.loss_fn(params, (tokens, positions, labels))
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)


def test_attention_is_bidirectional(bert: SimpleNamespace) -> None:
    """Changing the last token changes the first position's hidden state (no causal mask)."""
    model, config = bert.model, bert.workloads.TINY
    params = model.init(jax.random.key(2), config)
    tokens = np.zeros((1, config.seq), np.int32)
    other = tokens.copy()
    other[0, -1] = 1
    first = [model.encode(params, t)[0, 0] for t in (tokens, other)]
    assert not np.allclose(first[0], first[1])


def test_weight_decay_skips_biases_and_norms(bert: SimpleNamespace) -> None:
    params = bert.model.init(jax.random.key(0), bert.workloads.TINY)
    decayed = {
        jax.tree_util.keystr(path): flag
        for path, flag in jax.tree_util.tree_flatten_with_path(decay_mask(params))[0]
    }
    on = {name for name, flag in decayed.items() if flag}
    assert {"['wte']", "['wpe']", "['mlm']['w']", "['blocks'][1]['attn']['wqkv']"} <= on
    assert {"['blocks'][0]['mlp']['w_in']", "['blocks'][0]['attn']['wo']"} <= on
    for name in on:
        assert not name.endswith(("['scale']", "['bias']", "['b']", "['bqkv']", "['b_in']"))
    assert "['mlm']['bias']" in decayed and "['blocks'][0]['ln1']['scale']" in decayed


def test_float16_params_keep_float32_moments(bert: SimpleNamespace) -> None:
    model = bert.model
    config = model.Config(vocab=128, seq=16, layers=1, d_model=32, heads=4, dtype="float16")
    optimizer = model.make_optimizer()
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), config))
    state = jax.eval_shape(optimizer.init, params)
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype("float16")}
    mu = state[0].mu  # optax.lamb: scale_by_adam's state first
    assert {x.dtype for x in jax.tree.leaves(mu)} == {jnp.dtype("float32")}
    batch = bert.workloads.batch_shapes(config, 2)
    new_params, new_state, loss = jax.eval_shape(
        model.make_train_step(optimizer), params, state, batch
    )
    assert jax.tree.map(lambda x: x.dtype, new_params) == jax.tree.map(lambda x: x.dtype, params)
    assert structure(new_state) == structure(state)
    assert loss.dtype == jnp.float32


# ---- the cost-report factories -----------------------------------------------------------------


@pytest.mark.parametrize("name", FACTORIES)
def test_factories_take_mesh_and_microbatches_keywords(bert: SimpleNamespace, name: str) -> None:
    defaults = keyword_defaults(getattr(bert.workloads, name))
    assert defaults["mesh"] is None and defaults["microbatches"] is None


@pytest.mark.parametrize(("name", "micro"), [("bert_base", 32), ("bert_large", 8)])
def test_shapes_and_shardings_on_dp_tp(bert: SimpleNamespace, name: str, micro: int) -> None:
    mesh = ipujax.make_mesh((4, 4), ("dp", "tp"))
    fun, args, jit_kwargs = getattr(bert.workloads, name)(mesh=mesh)
    params, opt_state, (tokens, positions, labels) = args
    assert callable(fun) and all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(args))
    assert set(jit_kwargs) == {"mesh", "in_shardings"} and jit_kwargs["mesh"] is mesh
    pspecs, sspecs, batch = jit_kwargs["in_shardings"]
    assert structure(pspecs) == structure(params)
    assert structure(sspecs) == structure(opt_state)
    assert batch == (P("dp", None),) * 3
    assert pspecs["blocks"][0]["attn"]["wqkv"] == P(None, "tp", None, None)
    assert pspecs["blocks"][0]["mlp"]["w_out"] == P("tp", None)
    assert tokens.shape == (micro * 4, 128) and tokens.dtype == jnp.int32
    assert positions.shape == labels.shape == (micro * 4, 20)
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype("float16")}
    assert params["wte"].shape[0] == 30592  # 30,522 padded to a multiple of 128


def test_without_a_mesh_one_ipu(bert: SimpleNamespace) -> None:
    _, args, jit_kwargs = bert.workloads.bert_base()
    assert jit_kwargs == {}
    assert [x.shape for x in args[2]] == [(32, 128), (32, 20), (32, 20)]


@pytest.mark.parametrize(("name", "published"), [("bert_base", 110e6), ("bert_large", 335e6)])
def test_parameter_counts(bert: SimpleNamespace, name: str, published: float) -> None:
    params = getattr(bert.workloads, name)()[1][0]
    count = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
    assert abs(count - published) < 0.02 * published, count


def test_bert_large_layout(bert: SimpleNamespace) -> None:
    params = bert.workloads.bert_large()[1][0]
    assert len(params["blocks"]) == 24
    assert params["wte"].shape == (30592, 1024)
    assert params["blocks"][0]["attn"]["wqkv"].shape == (1024, 16, 3, 64)
    assert params["blocks"][0]["attn"]["wo"].shape == (16, 64, 1024)
    assert params["blocks"][0]["mlp"]["w_in"].shape == (1024, 4096)


def test_a_pp_axis_pipelines_and_splits_nothing(bert: SimpleNamespace) -> None:
    mesh = ipujax.make_mesh((4, 4), ("dp", "pp"))
    _, args, jit_kwargs = bert.workloads.bert_large(mesh=mesh)
    assert args[2][0].shape == (8 * 4 * 2048, 128)  # Graphcore's Pod16 batch, 65,536
    assert jit_kwargs["pipeline"] == ipujax.Pipeline(
        axis="pp",
        stages="auto",
        microbatches=2048,
        recompute=True,
        optimizer_state_offchip=True,  # Graphcore's optimizer_state_offchip
    )
    assert spec_axes(jit_kwargs["in_shardings"]) == {"dp"}
    _, args, jit_kwargs = bert.workloads.bert_large(mesh=mesh, microbatches=64)
    assert args[2][0].shape == (8 * 4 * 64, 128)
    assert jit_kwargs["pipeline"].microbatches == 64
    _, args, jit_kwargs = bert.workloads.tiny(mesh=ipujax.make_mesh((2,), ("pp",)))
    assert args[2][0].shape == (4 * bert.workloads.TINY_MICROBATCHES, 16)
    assert isinstance(args[2][0], np.ndarray)
    assert jit_kwargs["pipeline"].microbatches == bert.workloads.TINY_MICROBATCHES
    assert spec_axes(jit_kwargs["in_shardings"]) == set()


# ---- train.py ------------------------------------------------------------------------------


def test_train_check_passes(
    bert: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "step.json"
    flags = ["--mesh", "dp=2,tp=2", "--steps", "2", "--log-every", "1"]
    assert run_train(bert, *flags, "--check", "--report", str(report)) == 0
    out = capsys.readouterr().out
    assert "check passed: 2 steps" in out
    losses = printed_losses(out)
    assert len(losses) == 2 and all(np.isfinite(losses))
    data = json.loads(report.read_text())
    assert data["total_cycles"] > 0 and data["ipus"] == 4
    assert {("tp",), ("dp",)} <= {tuple(c["axes"]) for c in data["collectives"]}


def test_train_check_fails_when_jax_jit_disagrees(
    bert: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    skew_reference(monkeypatch, bert.train, lambda out: (None, None, out[2] * 1.001))
    assert run_train(bert, "--steps", "2", "--check") == 1
    assert "check failed at step 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--mesh", "dp=2,tp=3"], "heads"),
        (["--mesh", "dp=2", "--pipeline"], "--pipeline needs a mesh axis named pp"),
        (["--mesh", "dp=2,pp=2", "--pipeline", "--microbatches", "3"], "--batch 8"),
        (["--mesh", "dp2"], "--mesh"),
    ],
)
def test_train_user_errors_are_one_line(
    bert: SimpleNamespace, flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in usage_error(run_train(bert, "--steps", "1", *flags), capsys)

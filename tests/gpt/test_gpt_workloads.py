"""workloads.py: factories for the cost-report CLI, (fun, args, jit_kwargs) with shardings
derived from the mesh they are given."""

from __future__ import annotations

import math
from types import SimpleNamespace

import jax
import pytest
from helpers import keyword_defaults
from jax.sharding import PartitionSpec as P

import ipujax

NAMES = ["tiny", "gpt2_small", "gpt2_medium", "gpt3_175b", "gpt3_175b_popxl", "gpt3_175b_unscoped"]


@pytest.mark.parametrize("name", NAMES)
def test_factories_take_a_mesh_keyword(gpt: SimpleNamespace, name: str) -> None:
    assert keyword_defaults(getattr(gpt.workloads, name))["mesh"] is None


@pytest.mark.parametrize("name", ["gpt2_small", "gpt2_medium"])
def test_structure(gpt: SimpleNamespace, name: str) -> None:
    mesh = ipujax.make_mesh((2, 4), ("dp", "tp"))
    fun, args, jit_kwargs = getattr(gpt.workloads, name)(mesh=mesh)
    assert callable(fun) and len(args) == 3
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(args))
    assert jit_kwargs["mesh"] is mesh
    pspecs, sspecs, batch = jit_kwargs["in_shardings"]
    is_spec = lambda x: isinstance(x, P)  # noqa: E731
    assert jax.tree.structure(pspecs, is_leaf=is_spec) == jax.tree.structure(args[0])
    assert jax.tree.structure(sspecs, is_leaf=is_spec) == jax.tree.structure(args[1])
    assert batch == P("dp", None)
    assert args[2].shape[0] == 8 * 2  # per-replica batch times dp
    assert args[0]["wte"].shape[0] % 128 == 0  # the padded vocabulary


def test_without_a_mesh_one_ipu(gpt: SimpleNamespace) -> None:
    _, args, jit_kwargs = gpt.workloads.gpt2_small()
    assert jit_kwargs == {}
    assert args[2].shape == (8, 1025)


def test_gpt3_175b_is_shapes_only(gpt: SimpleNamespace) -> None:
    mesh = ipujax.make_mesh((4, 4, 4), ("dp", "tp1", "tp2"))
    _, (params, opt_state, tokens), jit_kwargs = gpt.workloads.gpt3_175b(mesh=mesh)
    leaves = jax.tree.leaves((params, opt_state, tokens))
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    assert len(params["blocks"]) == 96
    assert params["wte"].shape == (50304, 12288)
    assert params["blocks"][0]["attn"]["wqkv"].shape == (12288, 96, 3, 128)
    count = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
    assert 174e9 < count < 176e9
    assert tokens.shape == (4, 2049)
    assert jit_kwargs["in_shardings"][0]["blocks"][0]["mlp"]["w_in"] == P("tp2", "tp1")


def test_tiny_compiles_to_a_cost_report(gpt: SimpleNamespace) -> None:
    target = ipujax.Target.bow().with_tiles(64)
    mesh = ipujax.make_mesh((2, 2), ("dp", "tp"), target=target)
    fun, args, jit_kwargs = gpt.workloads.tiny(mesh=mesh)
    report = ipujax.jit(fun, **jit_kwargs).lower(*args).compile().cost_report()
    assert report.total_cycles > 0 and report.seconds > 0 and report.fits
    assert {("tp",), ("dp",)} <= {c.axes for c in report.collectives}
    assert "total cycles" in report.summary()


def test_a_pp_axis_pipelines_the_step(gpt: SimpleNamespace) -> None:
    """With a pp axis the batch is per replica x dp x micro-batches, under an ipujax.Pipeline."""
    mesh = ipujax.make_mesh((2, 2), ("dp", "pp"))
    _, (_, _, tokens), kwargs = gpt.workloads.tiny(mesh=mesh)
    pipeline = kwargs["pipeline"]
    assert pipeline.axis == "pp" and pipeline.recompute
    assert tokens.shape[0] == 4 * 2 * pipeline.microbatches


def test_layers_make_a_shallower_copy(gpt: SimpleNamespace) -> None:
    """`layers` (the depth by default) is what `ipujax plan` extrapolates from."""
    _, (params, _, _), _ = gpt.workloads.gpt3_175b(layers=2)
    assert len(params["blocks"]) == 2
    _, (params, _, _), _ = gpt.workloads.gpt2_small()
    assert len(params["blocks"]) == 12

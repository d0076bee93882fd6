"""workloads.py: factories for the cost-report CLI, (fun, args, jit_kwargs) with shapes only and
the data-parallel shardings of the mesh they are given."""

from __future__ import annotations

import dataclasses
import math
import warnings
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest
from helpers import keyword_defaults
from jax.sharding import PartitionSpec as P

import ipujax

NAMES = ["resnet50", "resnet50_mk2", "resnet50_bow", "small"]


@pytest.mark.parametrize("name", NAMES)
def test_factories_take_a_mesh_keyword(resnet: SimpleNamespace, name: str) -> None:
    assert keyword_defaults(getattr(resnet.workloads, name))["mesh"] is None


@pytest.mark.parametrize("optimizer", ["sgd", "lars"])
def test_resnet50_on_a_pod16(resnet: SimpleNamespace, optimizer: str) -> None:
    mesh = ipujax.make_mesh((16,), ("dp",), target=ipujax.Target.mk2())
    fun, args, jit_kwargs = resnet.workloads.resnet50(mesh=mesh, optimizer=optimizer)
    params, bn_state, opt_state, images, labels = args
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(args))
    # Graphcore's configuration: 18 images per replica, 8-bit images from the host, momentum
    # in float16 ("16.16"), each replica's own running statistics of batch norm.
    assert images.shape == (18 * 16, 224, 224, 3) and images.dtype == jnp.uint8
    assert labels.shape == (18 * 16,) and labels.dtype == jnp.int32
    assert sum(math.prod(x.shape) for x in jax.tree.leaves(params)) == 25_557_032
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype("float16")}
    floats = [x for x in jax.tree.leaves(opt_state) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert floats and {x.dtype for x in floats} == {jnp.dtype("float16")}
    assert all(x.shape[0] == 16 for x in jax.tree.leaves(bn_state))
    assert jit_kwargs["mesh"] is mesh
    assert jit_kwargs["in_shardings"] == (P(), P("dp"), P(), P("dp"), P("dp"))
    # The step's outputs have the inputs' structure and types: it can run step after step.
    new_params, new_bn, new_opt, loss = jax.eval_shape(fun, *args)
    assert jax.tree.map(lambda x: (x.shape, x.dtype), new_params) == jax.tree.map(
        lambda x: (x.shape, x.dtype), params
    )
    assert jax.tree.map(lambda x: (x.shape, x.dtype), new_bn) == jax.tree.map(
        lambda x: (x.shape, x.dtype), bn_state
    )
    assert jax.tree.map(lambda x: (x.shape, x.dtype), new_opt) == jax.tree.map(
        lambda x: (x.shape, x.dtype), opt_state
    )
    assert loss.shape == () and loss.dtype == jnp.float32


def test_resnet50_with_gradient_accumulation(resnet: SimpleNamespace) -> None:
    mesh = ipujax.make_mesh((16,), ("dp",), target=ipujax.Target.mk2())
    fun, args, jit_kwargs = resnet.workloads.resnet50(mesh=mesh, accumulation=3)
    images, labels = args[3:]
    assert images.shape == (3, 18 * 16, 224, 224, 3) and labels.shape == (3, 18 * 16)
    assert jit_kwargs["in_shardings"][3:] == (P(None, "dp"), P(None, "dp"))
    new_params, *_ = jax.eval_shape(fun, *args)
    assert jax.tree.structure(new_params) == jax.tree.structure(args[0])


def test_without_a_mesh_one_ipu(resnet: SimpleNamespace) -> None:
    _, args, jit_kwargs = resnet.workloads.resnet50()
    assert jit_kwargs == {}
    assert args[3].shape == (18, 224, 224, 3)
    assert all(len(x.shape) == 1 for x in jax.tree.leaves(args[1]))  # one replica's statistics
    _, args, jit_kwargs = resnet.workloads.small()
    assert jit_kwargs == {} and args[3].shape == (8, 32, 32, 3) and args[3].dtype == jnp.float32


def test_other_batch_and_dtype(resnet: SimpleNamespace) -> None:
    mesh = ipujax.make_mesh((4,), ("dp",))
    _, args, _ = resnet.workloads.resnet50(mesh=mesh, batch_per_replica=2, dtype="float32")
    assert args[3].shape == (8, 224, 224, 3) and args[3].dtype == jnp.uint8
    assert {x.dtype for x in jax.tree.leaves(args[0])} == {jnp.dtype("float32")}


@pytest.mark.multi_ipu
def test_small_compiles_data_parallel_without_gathers(resnet: SimpleNamespace) -> None:
    target = ipujax.Target.mk2().with_tiles(64)
    mesh = ipujax.make_mesh((4,), ("dp",), target=target)
    fun, args, jit_kwargs = resnet.workloads.small(mesh=mesh)
    with warnings.catch_warnings():
        # A ReplicationWarning would mean an op gathered the dp-split batch to run whole.
        warnings.simplefilter("error", ipujax.ReplicationWarning)
        compiled = ipujax.jit(fun, **jit_kwargs).lower(*args).compile()
    report = compiled.cost_report()
    assert report.total_cycles > 0 and report.fits
    assert compiled.replica_axes == ("dp",)
    assert {c.kind for c in report.collectives} == {"all_reduce"}
    assert {c.axes for c in report.collectives} == {("dp",)}


def test_graphcores_bow_configuration_fits(resnet: SimpleNamespace) -> None:
    # resnet50_mlperf_pod16_bs20 (TensorFlow 1): 20 images per replica and micro-batch, 6
    # accumulated, recomputed from its pipeline splits, matmuls planned within 0.15 of a tile.
    # With each block recomputed and the default proportion (0.6) the same step needs
    # 723,848 B on its fullest tile: three 21.8 KB stem tensors kept, 16 checkpoints, and 175 KB
    # of a 1x1 convolution's operand blocks and partials on top of them.
    mesh = ipujax.make_mesh((16,), ("dp",), target=ipujax.Target.bow())
    fun, args, jit_kwargs = resnet.workloads.resnet50_bow(mesh)
    assert args[3].shape == (6, 16 * 20, 224, 224, 3)
    assert jit_kwargs["mesh"].target.available_memory_proportion == 0.15
    assert jit_kwargs["mesh"].axis_shapes == (16,) and jit_kwargs["mesh"].system == mesh.system
    report = ipujax.jit(fun, **jit_kwargs).lower(*args).compile().cost_report()
    assert report.fits and report.peak_tile_bytes <= 638_976


def test_the_configs_graphcore_ran(resnet: SimpleNamespace) -> None:
    w = resnet.workloads
    mesh = ipujax.make_mesh((64,), ("dp",), target=ipujax.Target.bow())
    _, args, jit_kwargs = w.resnet50_bow(mesh)  # the Pod64 config on more than 16 replicas
    assert args[3].shape == (2, 64 * 20, 224, 224, 3)
    assert jit_kwargs["mesh"].target.available_memory_proportion == 0.145
    _, args, jit_kwargs = w.resnet50_mk2()  # one IPU without a mesh: the config's proportion
    assert args[3].shape == (57, 18, 224, 224, 3)
    assert jit_kwargs["mesh"].target == dataclasses.replace(
        ipujax.Target.mk2(), available_memory_proportion=0.16
    )
    assert w.MK2_POD16.checkpoints == w.PYTORCH_CHECKPOINTS

"""The programs the benchmark runner measures: the GPT AdamW step of `examples/gpt/model.py`
with its real arguments and shardings (from `examples/gpt/workloads.py`), a chain of matmuls,
and the Bow IPUs they run on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import spmd_compare  # noqa: F401  (it puts the repository and examples/ on sys.path)
from jax.sharding import PartitionSpec as P
from shared.load import example

import ipujax


def workloads() -> ModuleType:
    """examples/gpt/workloads.py."""
    return example("gpt", "workloads")


@dataclass(frozen=True)
class GptStep:
    """The GPT AdamW step's real arguments; `fresh()` is a new step function each time, so
    jax's caches keyed by the function cannot carry a compile from one measurement to the next."""

    config: Any
    optimizer: Any
    args: tuple[Any, Any, Any]  # params, opt_state, tokens

    def fresh(self) -> Callable[..., Any]:
        return workloads().model.make_train_step(self.optimizer)

    def specs(self, mesh: ipujax.Mesh) -> tuple[Any, Any]:
        """in_shardings from workloads.py; out_shardings pinned to the inputs' (loss replicated)."""
        params, opt_state, _ = self.args
        kwargs = workloads()._jit_kwargs(mesh, params, opt_state, self.config)
        in_specs = kwargs["in_shardings"]
        return in_specs, (in_specs[0], in_specs[1], P())


def bow(tiles: int | None) -> ipujax.Target:
    """A Bow IPU, of all its 1,472 tiles (None) or of `tiles`."""
    return ipujax.Target.bow() if tiles is None else ipujax.Target.bow().with_tiles(tiles)


def gpt_step(config_fields: dict[str, int], batch: int) -> GptStep:
    """The step with `model.Config(**config_fields)`, its initial parameters and optimizer
    state, and `batch` sequences of random tokens."""
    model = workloads().model
    config = model.Config(**config_fields)
    optimizer = model.make_optimizer()
    params = jax.jit(model.init, static_argnums=1)(jax.random.key(0), config)  # one dispatch
    tokens = np.random.default_rng(0).integers(
        0, config.vocab, (batch, config.seq + 1), dtype=np.int32
    )
    return GptStep(config, optimizer, (params, optimizer.init(params), tokens))


def matmul_chain(size: int, depth: int) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """x -> tanh(x @ w) `depth` times, on [size, size] f32 matrices."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((size, size), np.float32)
    scale = np.float32(1 / np.sqrt(size))  # a float64 scalar would make the weights float64
    ws = [scale * rng.standard_normal((size, size), np.float32) for _ in range(depth)]

    def chain(x: jax.Array, ws: list[jax.Array]) -> jax.Array:
        for w in ws:
            x = jnp.tanh(x @ w)
        return x

    return chain, (x, ws)


def ipujax_kwargs(step: GptStep, mesh: ipujax.Mesh) -> dict[str, Any]:
    if mesh.ipus == 1:
        return {"mesh": mesh}
    in_specs, out_specs = step.specs(mesh)
    return {"mesh": mesh, "in_shardings": in_specs, "out_shardings": out_specs}

"""Phases that read an input only by static slices load the slices alone (`sliced_reads`):
weights stacked over the layers and read `ws[i]` stream as weights kept one per layer do, as
PopXL loads one entry of a remote buffer per phase, derived by hand on a small MLP."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import ipujax

TARGET = dataclasses.replace(ipujax.Target.bow().with_tiles(16), io_tiles=0)
MESH = ipujax.make_mesh((1,), ("ipu",), target=TARGET)
LAYERS, D, ROWS = 4, 32, 4


def _step(ws: Any, x: jax.Array) -> Any:
    def loss(ws: Any) -> jax.Array:
        h = x
        for i in range(LAYERS):
            with jax.named_scope(f"layer{i}"):
                h = h + jnp.tanh(h @ ws[i])
        return (h**2).mean()

    return jax.tree.map(lambda w, g: w - 0.1 * g, ws, jax.grad(loss)(ws))


def _report(ws: Any) -> ipujax.CostReport:
    x = jax.ShapeDtypeStruct((ROWS, D), jnp.float32)
    return ipujax.jit(_step, mesh=MESH, phases="auto").lower(ws, x).compile().cost_report()


@pytest.fixture(scope="module")
def stacked() -> ipujax.CostReport:
    return _report(jax.ShapeDtypeStruct((LAYERS, D, D), jnp.float32))


@pytest.fixture(scope="module")
def listed() -> ipujax.CostReport:
    return _report([jax.ShapeDtypeStruct((D, D), jnp.float32)] * LAYERS)


def test_each_forward_phase_loads_its_layers_slice(stacked: ipujax.CostReport) -> None:
    # By hand: a layer's slice is 32 x 32 float32, 4,096 B; layer0 also loads x, 4 x 32 x 4 =
    # 512 B. The whole stack, 16,384 B, is loaded by no forward phase (it was, by every one).
    loads = {p.name: p.load_bytes for p in stacked.phases}
    assert loads["layer0"] == 4 * D * D + 4 * ROWS * D
    assert all(loads[f"layer{i}"] == 4 * D * D for i in range(1, LAYERS))


def test_a_stack_streams_as_much_as_weights_kept_one_per_layer(
    stacked: ipujax.CostReport, listed: ipujax.CostReport
) -> None:
    assert stacked.streaming_bytes == listed.streaming_bytes

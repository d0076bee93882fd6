"""Gradient accumulation in phases, as PopXL runs GPT-3 (docs/phases.md, "Loops"): the scan over
micro-batches is laid out inline and runs phase-major, each phase running every micro-batch of
its layer, so a phase loads its weights once per step whatever the micro-batches, its compute
grows with them, and the step still fits. GPT-3's shapes at 4 layers (the 96-layer step at
PopXL's 32 micro-batches is costed in docs/phases.md; its compile time in benchmarks/); the tiny
GPT's values against jax.jit."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import numpy as np
import pytest

import ipujax
from tests.helpers import assert_trees_close

LAYERS, TRIPS = 4, 32


@pytest.fixture(scope="module")
def reports(gpt: SimpleNamespace) -> dict[int, ipujax.Compiled]:
    mesh = ipujax.make_mesh((4, 8, 8), ("dp", "tp1", "tp2"), target=ipujax.Target.bow())
    out = {}
    for trips in (1, TRIPS):
        fun, args, kwargs = gpt.workloads.gpt3_175b(mesh, layers=LAYERS, accumulation=trips)
        out[trips] = ipujax.jit(fun, **kwargs, phases="auto").lower(*args).compile()
    return out


def _phase(compiled: ipujax.Compiled, name: str):
    (found,) = [p for p in compiled.cost_report().phases if p.name == name]
    return found


def test_the_micro_batches_run_phase_major_and_fit(reports) -> None:
    compiled = reports[TRIPS]
    (loop,) = compiled.built.plan.loops
    assert loop.trips == TRIPS
    report = compiled.cost_report()
    assert report.fits
    assert not [c for c in report.caveats if "loop" in c]
    names = [p.name for p in report.phases]
    for layer in range(LAYERS):
        assert f"layer{layer}" in names and f"layer{layer} (backward)" in names


@pytest.mark.parametrize("layer", [1, 2])
def test_a_layer_phase_computes_every_micro_batch_and_loads_its_weights_once(
    reports, layer: int
) -> None:
    """The forward phase's compute is 32 times one micro-batch's (the same tasks, each charged
    its trips; within 1% for layouts the loop's carried values take); what it loads grows only
    by each micro-batch's activations, not by 32 copies of the weights."""
    one, many = _phase(reports[1], f"layer{layer}"), _phase(reports[TRIPS], f"layer{layer}")
    assert TRIPS * one.compute_cycles <= many.compute_cycles <= 1.01 * TRIPS * one.compute_cycles
    assert many.load_bytes < TRIPS * one.load_bytes / 4


def test_the_step_does_32_micro_batches_of_work(reports) -> None:
    one, many = reports[1].cost_report(), reports[TRIPS].cost_report()
    assert 0.9 * TRIPS < many.flops / one.flops <= TRIPS


def test_the_tiny_gpt_accumulated_in_phases_equals_jax_jit(gpt: SimpleNamespace) -> None:
    config = gpt.model.Config(vocab=256, seq=16, layers=2, d_model=32, heads=4)
    optimizer = gpt.model.make_optimizer()
    params = gpt.model.init(jax.random.key(0), config)
    state = gpt.model.init_optimizer(optimizer, params)
    tokens = np.random.default_rng(0).integers(0, 256, (8, 17), dtype=np.int32)
    step = gpt.model.make_train_step(optimizer, micro_batches=4)
    compiled = ipujax.jit(step, phases="auto").lower(params, state, tokens).compile()
    (loop,) = compiled.built.plan.loops
    assert loop.trips == 4
    assert_trees_close(compiled(params, state, tokens), jax.jit(step)(params, state, tokens))

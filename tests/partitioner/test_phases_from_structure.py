"""Phases from a program's structure (docs/phases.md, "Phases from structure"): a training step
written without named scopes gets one forward and one backward phase per block it repeats,
cut where its scoped twin's scopes cut, with jax.jit's values; a program's own scopes still
win, and library names (flax's module paths, equinox's class names) are used as they serve."""

from __future__ import annotations

import dataclasses
from typing import Any

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import assert_trees_close, load_example

import ipujax
import lowering
from lowering import fuse_elementwise
from partitioner.phases.blocks import period, stacks, structure_labels
from partitioner.phases.scopes import scope_blocks
from partitioner.phases.split import split_auto
from partitioner.tiles.schedule import schedule

LAYERS = 3
TARGET = dataclasses.replace(ipujax.Target.bow().with_tiles(16), io_tiles=0)
MESH = ipujax.make_mesh((1,), ("ipu",), target=TARGET)
model = load_example("gpt", "model")


def _gpt_step(scopes: bool) -> tuple[Any, tuple]:
    """A tiny GPT's AdamW step (global-norm clipping), each block under jax.checkpoint."""
    config = model.Config(vocab=256, seq=16, layers=LAYERS, d_model=32, heads=4)
    optimizer = model.make_optimizer()
    params = model.init(jax.random.key(0), config)
    state = model.init_optimizer(optimizer, params)
    tokens = np.random.default_rng(0).integers(0, 256, (2, 17)).astype(np.int32)
    return model.make_train_step(optimizer, remat=True, scopes=scopes), (params, state, tokens)


def _phases(fun: Any, args: tuple) -> dict[str, list[str]]:
    """Each phase `phases="auto"` makes of the program as a phased build fuses it (each fusion
    within one line of source): its tasks' op names, a fusion's members in its place."""
    graph = ipujax.jit(fun, mesh=MESH).lower(*args).graph
    program, plan = split_auto(schedule(fuse_elementwise(graph, by_source=True), TARGET), TARGET)
    return {
        name: [m.name for task in program.tasks[a:b] for m in lowering.members(task.op)]
        for name, (a, b) in zip(plan.names, plan.bounds.bounds, strict=True)
    }


def _names(compiled: ipujax.Compiled) -> list[str]:
    return [p.name for p in compiled.cost_report().phases]


def test_a_period_and_its_stacks() -> None:
    sigs = np.array([9, 1, 2, 3, 1, 2, 3, 1, 2, 3, 7])
    assert period(sigs) == 3
    assert stacks(sigs, 3) == [(1, 10)]


def test_an_unscoped_gpt_gets_a_forward_and_a_backward_phase_per_block() -> None:
    step, args = _gpt_step(scopes=False)
    compiled = ipujax.jit(step, mesh=MESH, phases="auto").lower(*args).compile()
    blocks = [f"block{i}" for i in range(LAYERS)]
    assert _names(compiled) == [
        "prologue",
        *blocks,
        "epilogue",
        "epilogue (backward)",
        *[f"{b} (backward)" for b in reversed(blocks)],
        "prologue (backward)",
        # Clipping: the updates wait for the global norm, each in its block's optimizer phase.
        *[f"{b} (optimizer)" for b in blocks],
    ]


def test_the_blocks_are_cut_where_the_scopes_cut() -> None:
    """Each block's forward and backward phase holds exactly its scoped twin's layer's tasks."""
    scoped = _phases(*_gpt_step(scopes=True))
    unscoped = _phases(*_gpt_step(scopes=False))
    for i in range(LAYERS):
        for kind in ("", " (backward)", " (optimizer)"):
            assert unscoped[f"block{i}{kind}"] == scoped[f"layer{i}{kind}"], (i, kind)


def test_the_scoped_program_keeps_its_scopes() -> None:
    step, args = _gpt_step(scopes=True)
    compiled = ipujax.jit(step, mesh=MESH, phases="auto").lower(*args).compile()
    layers = [f"layer{i}" for i in range(LAYERS)]
    assert _names(compiled) == [
        "embed",
        *layers,
        "head",
        "loss",
        "loss (backward)",
        "head (backward)",
        *[f"{n} (backward)" for n in reversed(layers)],
        "embed (backward)",
        *[f"{n} (optimizer)" for n in layers],
    ]


def _mlp_loss(ws: list[jax.Array], x: jax.Array) -> jax.Array:
    for w in ws:
        x = jax.checkpoint(lambda x, w: x + jnp.tanh(x @ w))(x, w)
    return (x**2).mean()


OPTIMIZER = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))


def _adam(ws: list[jax.Array], state: Any, x: jax.Array) -> tuple[list[jax.Array], Any]:
    grads = jax.grad(_mlp_loss)(ws, x)
    updates, state = OPTIMIZER.update(grads, state, ws)
    return optax.apply_updates(ws, updates), state


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")  # a small step, its weights sent
def test_a_checkpointed_mlp_stack_is_phased_by_block_with_jax_jit_values() -> None:
    rng = np.random.default_rng(1)
    ws = [(0.1 * rng.standard_normal((64, 64))).astype(np.float32) for _ in range(4)]
    x = rng.standard_normal((8, 64)).astype(np.float32)
    state = OPTIMIZER.init(ws)
    compiled = ipujax.jit(_adam, mesh=MESH, phases="auto").lower(ws, state, x).compile()
    blocks = [f"block{i}" for i in range(4)]
    # Block 0's backward phase is the last, the global norm known: its update runs there.
    assert _names(compiled) == [
        *blocks,
        "epilogue",
        *[f"{b} (backward)" for b in blocks[::-1]],
        *[f"{b} (optimizer)" for b in blocks[1:]],
    ]
    assert_trees_close(compiled(ws, state, x), jax.jit(_adam)(ws, state, x))
    # Each block's forward phase is its layer: x + tanh(x @ w).
    phases = _phases(_adam, (ws, state, x))
    assert all(phases[b] == ["dot_general", "tanh", "add"] for b in blocks)
    # The blocks' names can be given as scopes' are.
    named = ipujax.jit(_adam, mesh=MESH, phases=blocks).lower(ws, state, x).compile()
    assert _names(named)[:4] == blocks


def _sgd_on_stacked_layers(ws: jax.Array, x: jax.Array) -> jax.Array:
    """The MLP stack above with its weights stacked in one [layers, 64, 64] array, each layer
    reading its slice (`ws[i]`): its gradient is every layer's slice padded to the stack's
    shape and summed layer by layer as the backward pass goes."""

    def loss(ws: jax.Array) -> jax.Array:
        h = x
        for i in range(ws.shape[0]):
            h = jax.checkpoint(lambda h, w: h + jnp.tanh(h @ w))(h, ws[i])
        return (h**2).mean()

    return ws - 0.1 * jax.grad(loss)(ws)


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")  # a small step, its weights sent
def test_weights_stacked_over_the_layers_are_phased_with_jax_jit_values() -> None:
    # The stack's gradient, summed across the layers' backward phases, is read by a block after
    # its home block's last phase: no optimizer phase can hold its update, which runs where its
    # operands are ready (the split asserted here before).
    rng = np.random.default_rng(2)
    ws = (0.1 * rng.standard_normal((4, 64, 64))).astype(np.float32)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    compiled = ipujax.jit(_sgd_on_stacked_layers, mesh=MESH, phases="auto").lower(ws, x).compile()
    assert _names(compiled)[:4] == [f"block{i}" for i in range(4)]
    assert_trees_close(compiled(ws, x), jax.jit(_sgd_on_stacked_layers)(ws, x))


def _two_stacks(ws: list[jax.Array], wide: jax.Array, vs: list[jax.Array], x: jax.Array) -> Any:
    """Three narrow tanh blocks, a widening matmul, four wide gelu blocks."""
    for w in ws:
        x = jax.checkpoint(lambda x, w: x + jnp.tanh(x @ w))(x, w)
    x = x @ wide
    for v in vs:
        x = jax.checkpoint(lambda x, v: x + jax.nn.gelu(x @ v) * 0.5)(x, v)
    return (x**2).mean()


def test_two_stacks_of_different_blocks_are_both_found() -> None:
    args = (
        [jax.ShapeDtypeStruct((32, 32), jnp.float32)] * 3,
        jax.ShapeDtypeStruct((32, 48), jnp.float32),
        [jax.ShapeDtypeStruct((48, 48), jnp.float32)] * 4,
        jax.ShapeDtypeStruct((8, 32), jnp.float32),
    )
    phases = _phases(jax.grad(_two_stacks, argnums=(0, 1, 2)), args)
    forward = ["block0", "block1", "block2", "interlude1", "block3", "block4", "block5", "block6"]
    backward = [f"{name} (backward)" for name in reversed(forward)]
    assert list(phases) == [*forward, "epilogue", *backward]


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")
def test_a_forward_pass_alone_is_left_to_the_byte_cuts() -> None:
    ws = [jax.ShapeDtypeStruct((64, 64), jnp.float32)] * 4
    x = jax.ShapeDtypeStruct((8, 64), jnp.float32)
    program = ipujax.jit(_mlp_loss, mesh=MESH).lower(ws, x).compile().program
    assert not any(structure_labels(program)) and scope_blocks(program) == []


class _FlaxBlock(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return x + nn.Dense(16)(jnp.tanh(nn.LayerNorm()(x)))


class _FlaxModel(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for _ in range(LAYERS):
            x = nn.remat(_FlaxBlock)()(x)
        return (x**2).sum()


def test_flax_module_paths_are_the_blocks() -> None:
    """Every task sits in the top module's scope: the blocks are the modules below it."""
    flax_model = _FlaxModel()
    x = jnp.ones((4, 16))
    params = flax_model.init(jax.random.key(0), x)
    phases = _phases(jax.grad(lambda p, x: flax_model.apply(p, x)), (params, x))
    blocks = [f"Checkpoint_FlaxBlock_{i}" for i in range(LAYERS)]
    assert list(phases) == [*blocks, *[f"{b} (backward)" for b in reversed(blocks)]]


class _EqxBlock(eqx.Module):
    linear: eqx.nn.Linear
    norm: eqx.nn.LayerNorm

    def __init__(self, key: jax.Array) -> None:
        self.linear, self.norm = eqx.nn.Linear(16, 16, key=key), eqx.nn.LayerNorm(16)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x + self.linear(jnp.tanh(self.norm(x)))


def _eqx_loss(blocks: list[_EqxBlock], x: jax.Array) -> jax.Array:
    for block in blocks:
        x = eqx.filter_checkpoint(lambda b, x: b(x))(block, x)
    return (x**2).sum()


def test_equinox_class_names_in_every_layer_give_way_to_structure() -> None:
    """`eqx.nn.Linear` names a kind of layer, used in every block: not a block of its own."""
    blocks = [_EqxBlock(k) for k in jax.random.split(jax.random.key(0), LAYERS)]
    phases = _phases(jax.grad(_eqx_loss), (blocks, jnp.ones(16)))
    names = [f"block{i}" for i in range(LAYERS)]
    assert list(phases) == [*names, "epilogue", *[f"{n} (backward)" for n in reversed(names)]]

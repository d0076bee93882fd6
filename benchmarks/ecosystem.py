"""The ecosystem section: the first call of models written with flax, equinox and haiku (the
models of tests/ecosystem, imported from there, so the benchmark times the programs the tests
check) through `ipujax.jit` against `jax.jit`'s, on the run section's meshes (ipujax issue 39:
at most 1.25x). Each compile is of a fresh step function, so no trace or executable carries
over; the two sides alternate, and the median of `Setup.compiles` compiles is taken."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import numpy as np
from measuring import log
from programs import bow
from results import Section, goal, markdown_table
from setups import MeshSpec, Setup
from timing import (
    FIRST_CALL_COLUMNS,
    FIRST_CALL_RATIO_GOAL,
    MeshRun,
    first_call_cells,
    first_calls,
)

import ipujax

TESTS = Path(__file__).resolve().parents[1] / "tests"


@dataclass(frozen=True)
class EcosystemProgram:
    """A training step of a library's model: `fresh()` is a new step function each call, `args`
    its arguments, `columns` the names of the weights a tp axis splits by columns (as the tests'
    layouts do) and `batch` the positions of the arguments a dp axis splits."""

    label: str
    step: Callable[..., Any]
    args: tuple[Any, ...]
    columns: tuple[str, ...]
    batch: tuple[int, ...]

    def fresh(self) -> Callable[..., Any]:
        step = self.step
        return lambda *args: step(*args)

    def specs(self, mesh: ipujax.Mesh) -> tuple[Any, ...]:
        """The arguments' specs on `mesh` as the tests give them (`layouts.Layout`): the batch
        over dp, the named weights' columns over tp, everything else left to propagation."""
        names = mesh.axis_names
        layout = _test_module("layouts").Layout(str(mesh), mesh, "dp" in names, "tp" in names)
        specs: list[Any] = [None] * len(self.args)
        specs[0] = layout.weights(self.args[0], self.columns)
        for position in self.batch:
            specs[position] = layout.batch
        return tuple(specs)


def _test_module(name: str) -> ModuleType:
    """A module of tests/ecosystem (it imports `layouts`, which imports tests/helpers)."""
    for folder in (TESTS, TESTS / "ecosystem"):
        if str(folder) not in sys.path:
            sys.path.append(str(folder))
    return __import__(name)


def flax_block() -> EcosystemProgram:
    """flax.linen's pre-norm transformer block (test_flax_linen.py) with AdamW."""
    m = _test_module("test_flax_linen")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(m.BATCH, m.SEQ, m.D_MODEL)).astype(np.float32)
    target = rng.normal(size=(m.BATCH, m.SEQ, m.D_MODEL)).astype(np.float32)
    params = m.Block().init(jax.random.key(2), x, train=False)["params"]
    args = (params, m.TX.init(params), jax.random.key(3), x, target)
    return EcosystemProgram("flax.linen transformer block", m._block_step, args, ("up",), (3, 4))


def equinox_mlp() -> EcosystemProgram:
    """equinox's MLP with LayerNorm and Dropout (test_equinox.py) with Adam."""
    m = _test_module("test_equinox")
    eqx = m.eqx
    params, static = eqx.partition(m.MLP(jax.random.key(0)), eqx.is_array)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(m.BATCH, m.FEATURES)).astype(np.float32)
    y = rng.integers(0, m.CLASSES, size=(m.BATCH,)).astype(np.int32)
    args = (params, m.TX.init(params), jax.random.key(1), x, y)
    return EcosystemProgram("equinox MLP", m._train_step(static), args, ("hidden",), (3, 4))


def haiku_mlp() -> EcosystemProgram:
    """dm-haiku's MLP with BatchNorm, whose moving averages are its state, and dropout
    (`hk.transform_with_state`, test_haiku.py) with Adam."""
    m = _test_module("test_haiku")
    x, y = m._batch()
    params, state = m.WITH_STATE.init(jax.random.key(0), x, is_training=True)
    args = (params, state, m.TX.init(params), jax.random.key(1), x, y)
    return EcosystemProgram("haiku MLP with BatchNorm", m._stateful_step, args, ("hidden",), (4, 5))


def measure(setup: Setup, program: EcosystemProgram, spec: MeshSpec) -> MeshRun:
    mesh = ipujax.make_mesh(spec.shape, spec.names, target=bow(setup.tiles))
    run = MeshRun(spec)
    for i in range(setup.compiles):
        log(f"ecosystem: {program.label} on {spec.label}: compile {i + 1} of {setup.compiles}")
        first_calls(program.fresh, program.args, mesh, program.specs(mesh), run)
    return run


HEADER = (
    "model",
    "mesh",
    *FIRST_CALL_COLUMNS,
    f"goal <= {FIRST_CALL_RATIO_GOAL:g}",
    "max abs diff",
)


def _row(program: EcosystemProgram, run: MeshRun) -> tuple[str, ...]:
    return (
        program.label,
        run.mesh.label,
        *first_call_cells(run),
        goal(run.first_call_ratio <= FIRST_CALL_RATIO_GOAL),
        f"{run.diff:.1e}",
    )


def ecosystem_section(setup: Setup) -> Section:
    measured = [
        (program, measure(setup, program, spec))
        for program in (flax_block(), equinox_mlp(), haiku_mlp())
        for spec in setup.meshes
    ]
    meaning = (
        "A training step (loss, gradients, an optax update) of each model of tests/ecosystem "
        "named, on its own small shapes, the batch split over dp and the named weights' "
        f"columns over tp; the median of {setup.compiles} compiles of fresh step functions per "
        "side, the two sides alternating. ipujax total = `jitted.lower(*args)` + `.compile()` + "
        "the first call (in which the runtime's XLA compile happens); jax.jit total = "
        "`jax.jit(step).lower(*args).compile()` + the first call; ratio = ipujax total / "
        "jax.jit total; max abs diff: between the two sides' outputs."
    )
    goals = tuple(
        (
            f"first call ratio, {program.label}, {run.mesh.label}: {run.first_call_ratio:.2f}",
            run.first_call_ratio <= FIRST_CALL_RATIO_GOAL,
        )
        for program, run in measured
    )
    rows = [_row(program, run) for program, run in measured]
    title = "Ecosystem models: first call, ipujax.jit against jax.jit"
    return Section("ecosystem", title, markdown_table(HEADER, rows), meaning, goals)

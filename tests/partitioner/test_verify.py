"""The BSP program's verifier (`partitioner.verify`): sound programs pass on every kind of build
(one IPU, a mesh with collectives, phases, a pipeline), and each invariant it checks catches a
program corrupted to break it."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import lowering
import partitioner
from lowering import Value, VerifyError
from partitioner.layout import Layout
from partitioner.program import Program
from partitioner.verify import verify_memory, verify_program

F32 = np.float32


def mlp(w1, w2, x):
    with jax.named_scope("layer0"):
        h = jnp.tanh(x @ w1)
    with jax.named_scope("layer1"):
        return jnp.sum(h @ w2)


def _graph() -> lowering.Graph:
    w = jax.ShapeDtypeStruct((64, 64), F32)
    x = jax.ShapeDtypeStruct((8, 64), F32)
    return lowering.eliminate_dead_code(lowering.lower(jax.grad(mlp, argnums=(0, 1)), w, w, x))


def _mesh(shape=(2, 2), names=("a", "b")) -> partitioner.Mesh:
    return partitioner.make_mesh(shape, names, target=partitioner.Target.bow().with_tiles(16))


def _built(options: partitioner.Options, shape=(2, 2), names=("a", "b")) -> partitioner.Built:
    specs = (P(None, "b"), P("b", None), P("a", None)) if len(shape) == 2 else (None,) * 3
    mesh = _mesh(shape, names)
    return partitioner.build(_graph(), mesh, specs, (None, None), options)


@pytest.mark.parametrize(
    "options, shape, names",
    [
        (partitioner.Options(verify=True), (1,), ("x",)),
        (partitioner.Options(verify=True), (2, 2), ("a", "b")),
        (partitioner.Options(verify=True, phases="auto", check_memory=False), (2, 2), ("a", "b")),
        (partitioner.Options(verify=True, phases=("layer0", "layer1")), (1,), ("x",)),
    ],
    ids=["one IPU", "dp x tp", "phased mesh", "phased by name"],
)
def test_sound_programs_pass(options, shape, names) -> None:
    built = _built(options, shape, names)
    verify_program(built.program, "test", built.mesh.shape)
    verify_memory(built.memory, "test")


@pytest.fixture(scope="module")
def built() -> partitioner.Built:
    return _built(partitioner.Options(verify=True))


def _with_task(program: Program, index: int, **changes) -> Program:
    tasks = list(program.tasks)
    tasks[index] = dataclasses.replace(tasks[index], **changes)
    return dataclasses.replace(program, tasks=tuple(tasks))


def _with_step(program: Program, index: int, **changes) -> Program:
    step = dataclasses.replace(program.tasks[index].supersteps[0], **changes)
    return _with_task(program, index, supersteps=(step, *program.tasks[index].supersteps[1:]))


def _first(program: Program, kind: str) -> int:
    return next(
        i for i, t in enumerate(program.tasks) if t.supersteps and t.supersteps[0].kind == kind
    )


def _computing(program: Program) -> int:
    return next(i for i, t in enumerate(program.tasks) if t.op.operands and t.supersteps)


def _caught(program: Program, mesh: partitioner.Mesh, match: str) -> None:
    with pytest.raises(VerifyError, match=match):
        verify_program(program, "corrupted", mesh.shape)


def _with_first(built, field: str, first) -> Program:
    """The program with the first computing task's `field` (a tuple) led by `first`."""
    program = built.program
    i = _computing(program)
    rest = getattr(program.tasks[i], field)[1:]
    return _with_task(program, i, **{field: (first, *rest)})


def _first_input(built) -> Value:
    return built.program.tasks[_computing(built.program)].inputs[0]


def test_a_read_before_its_value_is_made(built) -> None:
    read = _first_input(built)
    program = _with_first(built, "inputs", Value(10**9, read.shape, read.dtype))
    _caught(program, built.mesh, "before any task makes them")


def test_a_layout_of_another_shape(built) -> None:
    program = _with_first(built, "input_layouts", Layout((3,), (3,), (1,)))
    _caught(program, built.mesh, "laid out as shape")


def test_a_layout_on_tiles_the_ipu_lacks(built) -> None:
    made = built.program.tasks[_computing(built.program)].result_layouts[0]
    moved = dataclasses.replace(made, start=built.program.tiles)
    _caught(_with_first(built, "result_layouts", moved), built.mesh, "the IPU has 16")


def test_a_value_read_in_a_layout_it_does_not_have(built) -> None:
    read = _first_input(built)
    other = Layout(read.shape, (read.size,), (1,), start=3)  # all of it on tile 3
    assert other != built.program.layouts[read]
    _caught(_with_first(built, "input_layouts", other), built.mesh, "layout .* differs")


def test_a_superstep_with_negative_cycles(built) -> None:
    program = _with_step(built.program, _computing(built.program), compute_cycles=-1)
    _caught(program, built.mesh, r"negative \['compute_cycles'\]")


def test_a_superstep_on_tiles_the_ipu_lacks(built) -> None:
    program = _with_step(built.program, _computing(built.program), start=10, tiles=8)
    _caught(program, built.mesh, "runs on tiles 10..17, the IPU has 16")


def test_a_collective_without_its_record(built) -> None:
    program = _with_step(built.program, _first(built.program, "collective"), collective=None)
    _caught(program, built.mesh, "has no record")


def test_a_collective_over_an_axis_the_mesh_lacks(built) -> None:
    i = _first(built.program, "collective")
    record = dataclasses.replace(built.program.tasks[i].supersteps[0].collective, axes=("z",))
    _caught(_with_step(built.program, i, collective=record), built.mesh, r"runs over \['z'\]")


def test_a_collective_whose_group_is_not_the_mesh_axes(built) -> None:
    i = _first(built.program, "collective")
    record = dataclasses.replace(built.program.tasks[i].supersteps[0].collective, group_size=3)
    _caught(_with_step(built.program, i, collective=record), built.mesh, "group of 3 IPUs")


def test_a_collective_that_syncs_another_group(built) -> None:
    i = _first(built.program, "collective")
    _caught(_with_step(built.program, i, sync_group="ipu"), built.mesh, "syncs 'ipu'")


def test_an_output_no_task_makes(built) -> None:
    program = built.program
    ghost = Value(10**9, (1,), np.dtype(F32))
    corrupted = dataclasses.replace(program, outputs=(*program.outputs, ghost))
    _caught(corrupted, built.mesh, "are never made")


def test_negative_memory(built) -> None:
    always = built.memory.always_live.copy()
    always[5] = -(10**9)
    memory = dataclasses.replace(built.memory, always_live=always)
    with pytest.raises(VerifyError, match="tile 5 has -1000000000 B of variables_always_live"):
        verify_memory(memory, "corrupted")


def test_categories_that_do_not_add_up(built, monkeypatch) -> None:
    memory = built.memory
    parts = memory.categories()
    parts["stack"] = parts["stack"] + 1
    monkeypatch.setattr(type(memory), "categories", lambda self: parts)
    with pytest.raises(VerifyError, match="categories add up to"):
        verify_memory(memory, "corrupted")


def test_build_runs_it_after_its_passes(monkeypatch) -> None:
    """With `verify`, build checks the program after each pass: a pass that corrupts the
    program is caught and named."""
    import partitioner.passes as passes

    real = passes.split_phases

    def corrupting(program, phases, target):
        program, plan, fitted = real(program, phases, target)
        return _with_step(program, _computing(program), compute_cycles=-5), plan, fitted

    monkeypatch.setattr(passes, "split_phases", corrupting)
    with pytest.raises(VerifyError, match=r"^split phases: task"):
        _built(partitioner.Options(verify=True))
    _built(partitioner.Options(verify=False))  # not asked: not checked


def test_storages_handed_on_are_checked_against_the_program(monkeypatch) -> None:
    """The phase split hands its storages on to the memory sweep after sharding; with
    `verify`, storages that are not the program's own (one dropped) are caught there."""
    import partitioner.passes as passes

    real = passes.split_phases

    def dropping(program, phases, target):
        program, plan, fitted = real(program, phases, target)
        memory = dataclasses.replace(fitted.memory, storages=fitted.memory.storages[1:])
        return program, plan, dataclasses.replace(fitted, memory=memory)

    phased = partitioner.Options(verify=True, phases="auto", check_memory=False)
    monkeypatch.setattr(passes, "split_phases", dropping)
    with pytest.raises(VerifyError, match=r"^shard: the storages handed on differ"):
        _built(phased)


def test_value_uses_handed_on_are_checked_against_the_program(monkeypatch) -> None:
    """The phase split hands its value uses on to the memory sweep after sharding; with
    `verify`, uses that are not the program's own (a reader dropped) are caught at the pass
    that would read them."""
    import partitioner.passes as passes

    real = passes.split_phases

    def dropping(program, phases, target):
        program, plan, fitted = real(program, phases, target)
        made, reads, constants = fitted.uses
        reads = dict(reads)
        reads.pop(next(iter(reads)))
        return program, plan, dataclasses.replace(fitted, uses=(made, reads, constants))

    phased = partitioner.Options(verify=True, phases="auto", check_memory=False)
    _built(phased)  # the split's own uses pass
    monkeypatch.setattr(passes, "split_phases", dropping)
    with pytest.raises(
        VerifyError, match=r"^shard: the value uses handed on differ in their readers"
    ):
        _built(phased)

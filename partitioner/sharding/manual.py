"""shard_map in the per-IPU program: a `manual_computation`'s body is already what each IPU
runs, so the partitioner reshards its operands to the specs it names and inlines the body, its
collectives (`jax.lax.psum`, `all_gather`, `psum_scatter`, `ppermute`, `all_to_all`, read as
mesh axes by `lowering.manual`) costed and run like the ones the partitioner inserts; its
results are then split as its out_specs say, and the ops around it keep propagating.

A collective over IPUs that are all one (axes of one IPU) is the value itself, and an IPU's
place counts only the axes of more than one IPU: those are dropped or narrowed here, so the
program on one IPU has no collective at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from lowering import COLLECTIVES, Graph, Op, Value, renamed, walk
from partitioner.errors import ConfigError
from partitioner.sharding.builder import Builder
from partitioner.sharding.specs import Sharding


class _Partitioning(Protocol):
    b: Builder
    mesh: Mapping[str, int]
    local: dict[Value, tuple[Value, Sharding]]

    def operand(self, value: Value, want: Sharding, op: Op, why: str) -> Value: ...


def inline_manual(p: _Partitioning, op: Op) -> None:
    """`op`'s operands resharded to its in_specs, its body emitted on them, and its results
    recorded split as its out_specs say."""
    _check_mesh(op, p.mesh)
    why = f"an operand of the shard_map at {op.loc}"
    operands = [
        p.operand(v, Sharding(tuple(spec)), op, why)
        for v, spec in zip(op.operands, op.attrs["in_specs"], strict=True)
    ]
    (body,) = op.regions
    results = inline_body(p.b, body, operands, p.mesh)
    for value, local, spec in zip(op.results, results, op.attrs["out_specs"], strict=True):
        p.local[value] = (local, Sharding(tuple(spec)))


def inline_body(
    b: Builder, body: Graph, operands: Sequence[Value], mesh: Mapping[str, int]
) -> tuple[Value, ...]:
    """The body's ops emitted on `operands`, collectives over one IPU dropped."""
    env: dict[Value, Value] = dict(zip(body.inputs, operands, strict=True))
    for op in body.ops:
        op = renamed(op, env)
        if _alone(op, mesh):
            made: tuple[Value, ...] = tuple(op.operands)
        else:
            made = b.emit(op.name, op.operands, _narrowed(op, mesh), op.loc, op.regions)
        env.update(zip(op.results, made, strict=True))
    return tuple(env.get(v, v) for v in body.outputs)


def _alone(op: Op, mesh: Mapping[str, int]) -> bool:
    """A collective among IPUs that are one: its value is its operand's."""
    return op.name in COLLECTIVES and all(mesh.get(a, 1) == 1 for a in op.attrs["axes"])


def _narrowed(op: Op, mesh: Mapping[str, int]) -> dict[str, Any]:
    """An IPU's place counts the axes of more than one IPU only (an axis of one is not there
    to count in the per-IPU program)."""
    if op.name != "partition_id":
        return dict(op.attrs)
    axes = tuple(a for a in op.attrs["axes"] if mesh.get(a, 1) > 1)
    size = 1
    for a in axes:
        size *= mesh[a]
    return {"axes": axes, "group_size": size}


def _check_mesh(op: Op, mesh: Mapping[str, int]) -> None:
    """The shard_map's mesh must be the one the program runs on (by axis, as ipujax maps a
    jax mesh onto IPUs)."""
    named = dict(op.attrs["mesh"])
    differ = {a: (n, mesh.get(a)) for a, n in named.items() if mesh.get(a, 1) != n}
    if differ:
        raise ConfigError(
            f"the shard_map at {op.loc} runs over the mesh {named}, but the program runs on "
            f"{dict(mesh)}; pass ipujax.jit(mesh=...) the mesh the shard_map names"
        )


def inline_on_one_ipu(graph: Graph) -> Graph:
    """The program on one IPU: a shard_map's blocks are its whole operands, so its body runs
    on them as it is, in place of the op (in loops' and branches' regions too); its collectives
    (which jax leaves in the program when the mesh is one device) are their operands."""
    if not any(op.name in _MANUAL for op in walk(graph)):
        return graph
    env: dict[Value, Value] = {}
    ops: list[Op] = []

    def add(op: Op) -> None:
        op = renamed(op, env)
        if _alone(op, {}):
            env.update(zip(op.results, op.operands, strict=True))
        elif op.name == "manual_computation":
            _check_mesh(op, {})
            (body,) = op.regions
            env.update(zip(body.inputs, op.operands, strict=True))
            for inner in body.ops:
                add(inner)
            env.update(zip(op.results, (env.get(v, v) for v in body.outputs), strict=True))
        else:
            regions = tuple(inline_on_one_ipu(r) for r in op.regions)
            ops.append(dataclasses.replace(op, attrs=_narrowed(op, {}), regions=regions))

    for op in graph.ops:
        add(op)
    outputs = tuple(env.get(v, v) for v in graph.outputs)
    return dataclasses.replace(graph, ops=tuple(ops), outputs=outputs)


# What a one-IPU program inlines or drops.
_MANUAL = COLLECTIVES | {"manual_computation", "partition_id"}

"""Host IO: what one step streams between the host and each IPU, and what it costs
(docs/target.md, "Streaming memory, host and phases").

State stays on the device from step to step, as Poplar keeps a model's variables: an argument
that a step returns updated, along with other results (a returned pytree of the argument's
structure and types: weights, optimizer state), is not sent each step. Every other argument
(the batch, labels, a learning rate) comes from the host, each IPU receiving its own share, and
every other result (the loss, metrics) goes back. An inference function `f(params, x)` does not
return its weights, so they count as sent each step unless they are marked resident
(`ipujax.jit(resident_argnums=...)`, `Options.resident_inputs`): loaded onto the IPUs once, as
Poplar loads a model's weights, and never sent per step. A transfer costs a latency and its
bytes at the host rate, which the machine's host link caps when its IPUs all transfer; with IO
tiles it hides behind the step's compute.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lowering import Graph, SourceLoc, Value
from partitioner.mesh import Mesh, System
from partitioner.program import Program, Superstep
from partitioner.target import Target


@dataclass(frozen=True, slots=True)
class HostIO:
    """Bytes each IPU receives from and sends to the host in one step."""

    input_bytes: int = 0
    output_bytes: int = 0


def _returns_several(tree: Any) -> bool:
    return (
        tree is not None and tree.node_data() is not None and tree.node_data()[0] in (tuple, list)
    )


def _units(tree: Any, values: Sequence[Value], top: bool) -> list[tuple[Any, list[Value]]]:
    """The top-level pytrees of a function's arguments (`top`: each positional argument and
    keyword value) or results (each element of a returned tuple or list), with their leaves."""
    if tree is None:
        return [(None, [v]) for v in values]
    children = tree.children()
    if top:  # ((args...), {kwargs...})
        children = [c for part in children for c in part.children()]
    elif not _returns_several(tree):
        children = [tree]
    units, start = [], 0
    for child in children:
        units.append((child, list(values[start : start + child.num_leaves])))
        start += child.num_leaves
    return units


def _key(unit: tuple[Any, list[Value]]) -> tuple:
    tree, leaves = unit
    return (str(tree), tuple((v.shape, v.dtype) for v in leaves))


def _kept_arguments(
    arguments: list[tuple[Any, list[Value]]], results: list[tuple[Any, list[Value]]]
) -> tuple[set[int], list[Value]]:
    """Of a step that returns several things, each returned pytree that has the structure and
    types of an argument (in order, each argument once) is that argument's update, a state the
    device keeps: the kept arguments, and the results that go to the host."""
    kept: set[int] = set()
    sent: list[Value] = []
    for result in results:
        match = next(
            (i for i, a in enumerate(arguments) if i not in kept and _key(a) == _key(result)),
            None,
        )
        if match is None:
            sent += result[1]
        else:
            kept.add(match)
    return kept, sent


def sent_arguments(graph: Graph, resident: Sequence[int] = ()) -> list[list[int]]:
    """The arguments a step receives from the host, each as the flat input indices of its
    leaves: every argument the step does not return updated, less the `resident` inputs."""
    arguments, on_chip = _units(graph.in_tree, graph.inputs, top=True), frozenset(resident)
    kept: set[int] = set()
    if _returns_several(graph.out_tree):
        kept = _kept_arguments(arguments, _units(graph.out_tree, graph.outputs, top=False))[0]
    index = {v: i for i, v in enumerate(graph.inputs)}
    out = []
    for a, (_, leaves) in enumerate(arguments):
        flat = [index[v] for v in leaves if index[v] not in on_chip]
        if a not in kept and flat:
            out.append(flat)
    return out


def _sent_results(graph: Graph) -> list[Value]:
    """The results a step sends to the host: every one that is not an argument's update."""
    if not _returns_several(graph.out_tree):
        return list(graph.outputs)
    arguments = _units(graph.in_tree, graph.inputs, top=True)
    return _kept_arguments(arguments, _units(graph.out_tree, graph.outputs, top=False))[1]


def host_io(graph: Graph, resident: Sequence[int] = ()) -> HostIO:
    """What one IPU of `graph` (a per-IPU program) exchanges with the host per step; the
    `resident` inputs (flat indices) live on the IPUs between steps and are not sent."""
    sent = sent_arguments(graph, resident)
    received = sum(graph.inputs[i].nbytes for flat in sent for i in flat)
    return HostIO(received, sum(v.nbytes for v in _sent_results(graph)))


def host_rate(target: Target, system: System | None, ipus: int) -> float:
    """Bytes per second between the host and each IPU: the host rate, or the IPUs' share of
    their machine's host link when they all transfer at once."""
    sharing = min(ipus, system.ipus_per_machine) if system is not None else 1
    machine = target.host_link_bytes_per_second_per_machine / sharing
    return min(target.host_bytes_per_second, machine)


def host_cycles(target: Target, nbytes: int, rate: float) -> int:
    """One transfer: the latency, then the bytes at `rate`; nothing to send, nothing charged."""
    if nbytes <= 0:
        return 0
    return target.host_latency_cycles + math.ceil(nbytes * target.clock_hz / rate)


def host_supersteps(
    io: HostIO, target: Target, rate: float, hidden: int
) -> tuple[Superstep, Superstep]:
    """The step's transfers from and to the host, as supersteps of their own at its start and
    end: what `hidden` cycles of compute (IO tiles streaming while others compute) do not
    cover is exposed."""
    steps = []
    for name, nbytes in (("inputs", io.input_bytes), ("outputs", io.output_bytes)):
        cycles = host_cycles(target, nbytes, rate)
        covered = min(cycles, hidden)
        hidden -= covered
        steps.append(
            Superstep(
                name=f"host: {name}",
                op="host_copy",
                source=str(SourceLoc()),
                tiles=0,
                flops=0,
                exchange_bytes=nbytes,
                compute_cycles=0,
                exchange_cycles=0,
                sync_cycles=0,
                sync_group="host",
                link_cycles=cycles - covered,
                kind="host",
            )
        )
    return steps[0], steps[1]


def step_transfers(
    io: HostIO, program: Program, mesh: Mesh, target: Target, phased: bool
) -> tuple[Superstep, Superstep]:
    """The step's host transfers of `io` at the rate the mesh's IPUs share; a phased program's
    IO tiles hide them behind its compute."""
    hidden = 0
    if phased and target.phase_io_tiles:
        hidden = sum(s.compute_cycles for s in program.supersteps)
    return host_supersteps(io, target, host_rate(target, mesh.system, mesh.ipus), hidden)

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
bytes at the host rate, which the machine's host link caps when its IPUs all transfer. What
compute hides, a loop's prefetched slices or a phased program's IO tiles, is `prefetch.py`'s;
the rest is charged, and `HostTransfers` says which is which.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lowering import Graph, SourceLoc, Value
from partitioner.mesh import Mesh, System
from partitioner.phases.streaming import streaming_cycles
from partitioner.program import Program, Superstep
from partitioner.step.prefetch import StreamedLoop, io_tile_slack, streamed_loops
from partitioner.target import Target


@dataclass(frozen=True, slots=True)
class HostIO:
    """Bytes each IPU receives from and sends to the host in one step, and the per-IPU
    program's values they are (None when only the bytes are known: nothing then overlaps)."""

    input_bytes: int = 0
    output_bytes: int = 0
    inputs: tuple[Value, ...] | None = None
    outputs: tuple[Value, ...] | None = None


@dataclass(frozen=True, slots=True)
class HostTransfers:
    """The step's host transfers as charged: a superstep at its start (every input's bytes,
    a loop's prefetched slices too) and one at its end, each with its exposed cycles; the
    cycles compute hid, and how."""

    inputs: Superstep
    outputs: Superstep
    io: HostIO
    hidden_cycles: int = 0
    how: str = ""

    @property
    def charged_cycles(self) -> int:
        return self.inputs.link_cycles + self.outputs.link_cycles

    def note(self) -> str:
        """What was hidden and what charged, when compute hid some; else empty."""
        if not self.hidden_cycles:
            return ""
        whole = self.hidden_cycles + self.charged_cycles
        return (
            f"host: {self.hidden_cycles:,} of the transfers' {whole:,} cycles hidden behind "
            f"compute, {self.charged_cycles:,} charged: {self.how}"
        )


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


def sent_arguments(
    graph: Graph, resident: Sequence[int] = (), whole: Graph | None = None
) -> list[list[int]]:
    """The arguments a step receives from the host, each as the flat input indices of its
    leaves: every argument the step does not return updated, less the `resident` inputs.
    `whole` is the program before partitioning, when `graph` is one IPU's: an update is known
    by its global type, whatever sharding the step leaves it in."""
    return _sent(graph, resident, _kept(whole or graph)[0])


def _sent(graph: Graph, resident: Sequence[int], kept: set[int]) -> list[list[int]]:
    arguments, on_chip = _units(graph.in_tree, graph.inputs, top=True), frozenset(resident)
    index = {v: i for i, v in enumerate(graph.inputs)}
    out = []
    for a, (_, leaves) in enumerate(arguments):
        flat = [index[v] for v in leaves if index[v] not in on_chip]
        if a not in kept and flat:
            out.append(flat)
    return out


def _kept(graph: Graph) -> tuple[set[int], list[int]]:
    """The arguments a step returns updated, and the flat indices of the results it sends."""
    if not _returns_several(graph.out_tree):
        return set(), list(range(len(graph.outputs)))
    arguments = _units(graph.in_tree, graph.inputs, top=True)
    kept, sent = _kept_arguments(arguments, _units(graph.out_tree, graph.outputs, top=False))
    position = {v: i for i, v in enumerate(graph.outputs)}
    return kept, [position[v] for v in sent]


def kept_arguments(graph: Graph) -> list[list[int]]:
    """The arguments a step returns updated, each as the flat input indices of its leaves:
    taken as state the IPUs keep between calls (a training step's weights), never sent."""
    kept, _ = _kept(graph)
    units = _units(graph.in_tree, graph.inputs, top=True)
    index = {v: i for i, v in enumerate(graph.inputs)}
    return [[index[v] for v in units[i][1]] for i in sorted(kept)]


def host_io(graph: Graph, resident: Sequence[int] = (), whole: Graph | None = None) -> HostIO:
    """What one IPU of `graph` (a per-IPU program, `whole` before partitioning) exchanges with
    the host per step; the `resident` inputs (flat indices) live on the IPUs between steps and
    are not sent."""
    kept, results = _kept(whole or graph)
    sent = tuple(graph.inputs[i] for flat in _sent(graph, resident, kept) for i in flat)
    returned = tuple(graph.outputs[i] for i in results)
    received = sum(v.nbytes for v in sent)
    return HostIO(received, sum(v.nbytes for v in returned), sent, returned)


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


def _host_step(name: str, nbytes: int, exposed: int) -> Superstep:
    """A transfer from or to the host as a superstep of its own, its `exposed` cycles charged."""
    return Superstep(
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
        link_cycles=exposed,
        kind="host",
    )


def _later_trips(loop: StreamedLoop, target: Target, rate: float) -> int:
    """A loop's slices after the first: each is fetched while the trip before runs, then
    copied onto the tiles at the streaming rate, so a trip pays the copy, or what the host
    link cannot deliver within the trip, whichever is more."""
    fetch = host_cycles(target, loop.trip_bytes, rate)
    copy = streaming_cycles(target, loop.trip_bytes)
    return (loop.trips - 1) * max(copy, fetch - loop.trip_cycles)


def _prefetched(io: HostIO, program: Program, target: Target, rate: float) -> HostTransfers:
    """The step's transfers when the tiles do them (no IO tiles): the inputs in one transfer
    at its start, or, when it costs less, a loop's later slices prefetched trip by trip
    (`prefetch.py`) and the rest at the start; the results at its end."""
    whole = host_cycles(target, io.input_bytes, rate)
    loops = streamed_loops(program, io.inputs or ())
    first = io.input_bytes - sum(loop.later_bytes for loop in loops)
    charged = host_cycles(target, first, rate) + sum(_later_trips(x, target, rate) for x in loops)
    how = "; ".join(
        f"the loop at {x.loop.op.loc} reads {x.trip_bytes:,} B a trip: each of its "
        f"{x.trips - 1} later trips' slices is fetched while the trip before "
        f"({x.trip_cycles:,} cycles) runs, then copied onto the tiles"
        for x in loops
    )
    if charged >= whole:  # slices too small for their trips: sent whole at the start
        charged, how = whole, ""
    return HostTransfers(
        _host_step("inputs", io.input_bytes, charged),
        _host_step("outputs", io.output_bytes, host_cycles(target, io.output_bytes, rate)),
        io,
        whole - charged,
        how,
    )


def _on_io_tiles(io: HostIO, program: Program, target: Target, rate: float) -> HostTransfers:
    """A phased program's transfers, which its IO tiles move while the compute tiles run the
    tasks before the first reader of an input and after the last maker of a result."""
    before, after = io_tile_slack(program, io.inputs or (), io.outputs or ())
    fetch = host_cycles(target, io.input_bytes, rate)
    send = host_cycles(target, io.output_bytes, rate)
    hid_in, hid_out = min(fetch, before), min(send, after)
    how = (
        f"the IO tiles load the inputs during the {before:,} cycles before the first task "
        f"that reads one and send the results during the {after:,} after the last that "
        "makes one"
    )
    return HostTransfers(
        _host_step("inputs", io.input_bytes, fetch - hid_in),
        _host_step("outputs", io.output_bytes, send - hid_out),
        io,
        hid_in + hid_out,
        how,
    )


def step_transfers(
    io: HostIO, program: Program, mesh: Mesh, target: Target, phased: bool
) -> HostTransfers:
    """The step's host transfers of `io` at the rate the mesh's IPUs share: a phased
    program's IO tiles move them while it computes; without them, the tiles do, a loop's
    later slices prefetched while the trip before runs."""
    rate = host_rate(target, mesh.system, mesh.ipus)
    if phased and target.phase_io_tiles:
        return _on_io_tiles(io, program, target, rate)
    return _prefetched(io, program, target, rate)

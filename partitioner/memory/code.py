"""Code and state per tile, in the categories PopVision reports them: vertex code, vertex
state, exchange code, control code and stack (docs/target.md, "Tile memory and mapping").

`partitioner.memory.tiles` counts the variables by liveness; this module counts the rest from the
program's supersteps, each category by what Poplar stores for it:

- vertex code: a tile stores each codelet it runs once, however many steps run it. A codelet
  is a kind of vertex (`OP_VERTEX_KINDS`: the AMP's matmul vertex, an elementwise op, a
  reduction, a copy) made for one element type, and for elementwise ops and copies for one
  op; codelets of a kind share their framework (supervisor, work division) on a tile;
- vertex state: per compute set a tile works in, its vertex's fields, plus a fixed amount on
  every tile (random seed and supervisor state);
- exchange code: per exchange a tile sends or receives in, a fixed part, and a few
  instructions per message at each end; a tile receives one message from each tile it hears
  from, and the tiles that send share the messages out;
- control code: per step, on every tile, since every tile syncs at every step;
- stack: the supervisor's and its workers', on every tile.

Identical steps share their code and state, as Poplar shares a program's code between its
calls: a model of identical layers pays for one layer's. Exchange code for IPU-Links and the
host, and gaps between memory regions, are not counted (the totals are PopVision's "excluding
gaps").
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from lowering import CONTRACTIONS, DATA_MOVEMENT, ELEMENTWISE, FUSIONS, SHARD_OPS, SOURCES
from partitioner.layout import tile_bytes
from partitioner.program import Program, Superstep, Task
from partitioner.target import Target

# The vertex each op's compute sets run (`Target.vertex_kinds` gives its code and state), for
# every op of the vocabulary; None for ops that run no vertex (views, constants, annotations).
# A later superstep of a task reduces the partials of the first (`_SECOND_STAGE`), and a step
# of on-tile copies runs copy vertices, whatever its op.
OP_VERTEX_KINDS: dict[str, str | None] = {
    **dict.fromkeys(ELEMENTWISE, "elementwise"),
    **dict.fromkeys(FUSIONS, "elementwise"),  # a map expression's codelet
    **dict.fromkeys(CONTRACTIONS, "amp"),
    **dict.fromkeys(DATA_MOVEMENT, "copy"),
    **dict.fromkeys(SOURCES, "copy"),
    **dict.fromkeys(SHARD_OPS, "copy"),
    **dict.fromkeys(("while", "case"), "copy"),
    **dict.fromkeys(("scatter", "sort", "top_k"), "copy"),
    **dict.fromkeys(("reduce", "reduce_window", "select_and_scatter"), "reduce"),
    **dict.fromkeys(("all_reduce", "reduce_scatter"), "reduce"),
    **dict.fromkeys(("all_gather", "all_to_all", "collective_permute"), "copy"),
    # PopLibs' factorisations run their blocks' matmuls on the AMP; FFT butterflies are vector
    # work; a host callback runs no vertex (host stream copies).
    **dict.fromkeys(("cholesky", "lu", "triangular_solve"), "amp"),
    "fft": "elementwise",
    "host_callback": None,
    "constant": None,
    "reshape": None,
    "broadcast_in_dim": None,
    "optimization_barrier": None,
    "sharding_constraint": None,
    "manual_computation": None,  # inlined by the partitioner
}
_SECOND_STAGE = "reduce"
# Kinds whose codelets are made per op (BinaryOp<ADD, float>, MultiSlice...); the others per
# element type alone (ConvPartial1x1Out<float, float>, ReduceAdd<float, float>).
_PER_OP = frozenset({"elementwise", "copy"})

# The categories, in the order the report lists them: the variables (`partitioner.memory.tiles`),
# then this module's.
CODE_CATEGORIES = ("vertex_code", "vertex_state", "exchange_code", "control_code", "stack")
CATEGORIES = ("variables_always_live", "variables_not_always_live", *CODE_CATEGORIES)
# libpva's names (`tile.memory.category.<name>`) of what each category holds.
POPVISION_NAMES = {
    "variables_always_live": "always-live variables",
    "variables_not_always_live": "not-always-live variables",
    "vertex_code": "vertexCode",
    "vertex_state": "vertexInstanceState, vertexFieldData, vectorListDescriptor, copyDescriptor",
    "exchange_code": "internalExchangeCode",
    "control_code": "controlCode",
    "stack": "stack",
}


@dataclass(frozen=True, slots=True, eq=False)
class CodeMemory:
    """Bytes per tile of each code and state category."""

    vertex_code: np.ndarray
    vertex_state: np.ndarray
    exchange_code: np.ndarray
    control_code: np.ndarray
    stack: np.ndarray

    def by_category(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in CODE_CATEGORIES}

    @property
    def total(self) -> np.ndarray:
        return sum(self.by_category().values(), np.zeros_like(self.stack))


@dataclass(frozen=True, slots=True)
class _Step:
    """A distinct superstep, with the task it serves and the step before it in that task."""

    step: Superstep
    task: Task
    before: Superstep | None


def code_memory(program: Program, target: Target) -> CodeMemory:
    """Each category's bytes on every tile of one IPU."""
    tiles = target.tiles_per_ipu
    steps = list(_distinct_steps(program))
    return CodeMemory(
        vertex_code=_vertex_code(steps, target),
        vertex_state=_vertex_state(steps, target),
        exchange_code=_exchange_code(steps, target),
        control_code=np.full(tiles, len(steps) * target.control_code_bytes_per_step, np.int64),
        stack=np.full(tiles, _stack_bytes(target), np.int64),
    )


def _stack_bytes(target: Target) -> int:
    return target.supervisor_stack_bytes + target.threads_per_tile * target.worker_stack_bytes


def _distinct_steps(program: Program) -> Iterator[_Step]:
    """Supersteps that differ in what they run: repeats of a step share its code, counted where
    it first runs. Steps alike but for their first tile are repeats too: linear mapping's
    running start offset puts each call of a layer's small tensors on other tiles, where
    Poplar's calls of one compiled layer would find them in one place."""
    seen: set[tuple] = set()
    for task in _tasks(program):
        before = None
        for step in task.supersteps:
            key = (
                step.name,
                step.tiles,
                step.compute_cycles,
                step.exchange_cycles,
                step.busiest_tile_bytes,
            )
            if key not in seen:
                seen.add(key)
                yield _Step(step, task, before)
            before = step


def _tasks(program: Program) -> Iterator[Task]:
    """Every task, a control-flow task after the tasks of its regions: their steps come first,
    and the control-flow task's own repeats of them are then repeats."""
    for task in program.tasks:
        for region in task.regions:
            yield from _tasks(region)
        yield task


def _tiles(step: Superstep, tiles: int) -> slice:
    return slice(min(step.start, tiles), min(step.start + step.tiles, tiles))


def _kind(item: _Step) -> str | None:
    """The vertex a step runs, or None when it computes nothing."""
    step = item.step
    if step.compute_cycles <= 0 or step.tiles <= 0:
        return None
    if step.kind == "copy":
        return "copy"
    if item.before is not None:
        return _SECOND_STAGE
    return OP_VERTEX_KINDS[item.task.op.name]


def _codelet(item: _Step, kind: str) -> tuple[str, str, str]:
    """What tells codelets apart: their kind, their op when made per op, their element type."""
    op = item.task.op
    value = op.operands[0] if op.operands else op.results[0]
    # a map expression's codelet is generated for its expression: fusions of one chain share it
    name = "+".join(op.attrs["members"]) if op.name in FUSIONS else op.name
    return (kind, name if kind in _PER_OP else "", str(value.dtype))


def _vertex_code(steps: list[_Step], target: Target) -> np.ndarray:
    """Each codelet once on every tile that runs it, and each kind's shared code once."""
    tiles = target.tiles_per_ipu
    codelets: dict[tuple[str, str, str], np.ndarray] = {}
    for item in steps:
        kind = _kind(item)
        if kind is not None:
            on = codelets.setdefault(_codelet(item, kind), np.zeros(tiles, bool))
            on[_tiles(item.step, tiles)] = True
    code = np.zeros(tiles, np.int64)
    kinds: dict[str, np.ndarray] = {}
    for (kind, _, _), on in codelets.items():
        code += on * target.vertex_kind(kind).codelet_code_bytes
        kinds[kind] = kinds.get(kind, np.zeros(tiles, bool)) | on
    for kind, on in kinds.items():
        code += on * target.vertex_kind(kind).shared_code_bytes
    return code


def _vertex_state(steps: list[_Step], target: Target) -> np.ndarray:
    """A vertex's state per compute set a tile works in, and the fixed state of every tile."""
    tiles = target.tiles_per_ipu
    state = np.full(tiles, target.vertex_state_bytes_per_tile, np.int64)
    for item in steps:
        kind = _kind(item)
        if kind is not None:
            state[_tiles(item.step, tiles)] += target.vertex_kind(kind).state_bytes
    return state


def _exchange_code(steps: list[_Step], target: Target) -> np.ndarray:
    """Per exchange, its fixed code on every tile that sends or receives, and each message's
    code at both ends: on the tile that receives it and on the tile that sends it."""
    tiles = target.tiles_per_ipu
    code = np.zeros(tiles, np.int64)
    for item in steps:
        step = item.step
        if step.busiest_tile_bytes <= 0:
            continue
        receivers = np.zeros(tiles, bool)
        receivers[_tiles(step, tiles)] = True
        senders = np.zeros(tiles, bool)
        for start, stop in _sources(item):
            senders[min(start, tiles) : min(stop, tiles)] = True
        received = _messages(item)
        sent = math.ceil(int(receivers.sum()) * received / max(1, int(senders.sum())))
        code += (receivers | senders) * target.exchange_code_bytes_per_exchange
        code += (receivers * received + senders * sent) * target.exchange_code_bytes_per_message
    return code


def _sources(item: _Step) -> list[tuple[int, int]]:
    """The tiles that send: the previous stage's for a later step of a task, else the tiles
    that hold the task's inputs."""
    if item.before is not None:
        return [(item.before.start, item.before.start + item.before.tiles)]
    return [(layout.start, layout.stop) for layout in item.task.input_layouts]


def _messages(item: _Step) -> int:
    """How many tiles a receiving tile hears from. A later stage gathers, onto each of its
    tiles, the partials of that tile's block from the tiles of the stage before (a matmul's K
    split, a reduction's depth split). A first stage receives its bytes from tiles that hold,
    on average, what the task's inputs hold per tile: at least that many messages, at most
    one from every input tile."""
    step = item.step
    if item.before is not None:
        return max(1, math.ceil(item.before.tiles / max(1, step.tiles)))
    layouts = item.task.input_layouts
    held = sum(
        tile_bytes(layout, value.dtype) * layout.tiles
        for layout, value in zip(layouts, item.task.inputs, strict=True)
    )
    sources = sum(layout.tiles for layout in layouts)
    if held <= 0 or sources <= 0:
        return 1
    return max(1, min(sources, math.ceil(step.busiest_tile_bytes * sources / held)))

"""Liveness: which task spans each tensor's storage is on chip for, over a scheduled program.

Every value's bytes belong to a storage owner: views share their source's storage, and an
elementwise result overwrites an operand nothing reads afterwards (Poplar's in-place ops). An
owner is on chip from the task that makes it to the last task that reads it; phased, only in the
phases that use it (`PhaseBounds`), loaded at the start of each and stored at the end of the phase
that makes it when a later phase or the host reads it. `partitioner.memory.tiles` sums these
spans into bytes per tile.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from lowering import ELEMENTWISE, FUSIONS, Op, Value, op_reads
from partitioner.layout import Layout, tile_bytes
from partitioner.program import Program, Task


@dataclass(frozen=True, slots=True)
class Storage:
    """One tensor's storage on tiles and the task spans (inclusive) it is on chip for.

    Unphased, a tensor has one span, from the task that makes it to the last that reads it.
    Phased, a tensor in streaming memory is on chip only in the phases that use it."""

    value: Value
    layout: Layout
    spans: tuple[tuple[int, int], ...]
    always_live: bool
    ways: int = 1  # held as a 1/ways shard (replicated tensor sharding's updates)

    @property
    def bytes_per_tile(self) -> int:
        return -(-tile_bytes(self.layout, self.value.dtype) // self.ways)

    @property
    def first(self) -> int:
        return self.spans[0][0] if self.spans else 0

    def live_at(self, task: int) -> bool:
        return self.always_live or any(a <= task <= b for a, b in self.spans)


class PhaseBounds:
    """Task ranges of phases, `bounds[i] = (start, stop)`, in order and covering all tasks.
    `slices`: a phase that reads an input only by static slices loads the slices alone
    (`sliced_reads`); a pipeline stage's split into its micro-batches' work and its update
    (off-chip optimizer state) says False."""

    def __init__(self, bounds: list[tuple[int, int]], slices: bool = True) -> None:
        assert all(a == b for (_, a), (b, _) in itertools.pairwise([(0, 0), *bounds])), bounds
        self.bounds = bounds
        self.slices = slices
        # Each task's phase by table: the memory sweeps ask millions of times (GPT-3 on a
        # Pod256).
        self._of = [p for p, (a, b) in enumerate(bounds) for _ in range(a, b)]

    def phase_of(self, task: int) -> int:
        """The phase of `task`; before the first, the first; past the last, the last."""
        if task >= len(self._of):
            return max(0, len(self.bounds) - 1)
        return self._of[task] if task >= 0 else 0


def _roots(
    program: Program, phases: PhaseBounds | None, carried: Mapping[Value, Value] | None = None
) -> dict[Value, Value]:
    """Map every value to the value that owns its bytes: views share their source's storage,
    and an elementwise result (or a dynamic update's) overwrites an operand nothing reads
    afterwards (Poplar's in-place ops) when the two have the same layout and bytes and were made
    in the same phase (and neither is an argument or an output, which stream as themselves). In
    a loop's body, `carried` maps each output to the input it becomes next trip: an output made
    in place of that input overwrites the loop's own tensor (an accumulator's add). A constant
    equal to an earlier one is that one (`_EqualConstants`)."""
    return _Owners(program, phases, carried).root


class _Owners:
    """`_roots`' pass over the tasks: each value's owner (`root`, only those owned by another
    value), and for `value_uses` each owner's first task (`made`: a value's owner is settled
    when the task that makes it runs, so a second pass would find the same) and the
    constants."""

    def __init__(
        self,
        program: Program,
        phases: PhaseBounds | None,
        carried: Mapping[Value, Value] | None = None,
    ) -> None:
        self.root: dict[Value, Value] = {}
        self.made: dict[Value, int] = {}
        self.constants: set[Value] = set()
        self.layouts = program.layouts
        self.phase_of = phases.phase_of if phases is not None else None
        self.carried = carried or {}
        self.keep = set(program.inputs) | set(program.outputs)
        self.last = _last_reads(program)
        self.members_last: dict[Value, int] = {}  # per owner, the last read of any value it holds
        self.equal = _EqualConstants(program)
        self._sweep(program.tasks)

    def _sweep(self, tasks: Sequence[Task]) -> None:
        # One loop with the dicts' methods bound: it runs once per task of every stage's
        # program in each memory sweep of the plan search.
        root, made, members_last, last = self.root, self.made, self.members_last, self.last
        owner_of, last_read = root.get, last.get
        for index, task in enumerate(tasks):
            op = task.op
            results = op.results
            if op.name == "constant":
                self.constants.update(results)
                twin = self.equal.twin(task)
                if twin is not None:
                    root[results[0]] = twin
            if task.aliases:
                for result, alias in zip(results, task.aliases, strict=False):
                    if alias is not None:
                        source = task.inputs[alias]
                        root[result] = owner_of(source, source)
            elif len(results) == 1 and (op.name in _IN_PLACE or op.name == "dynamic_update_slice"):
                self._in_place(task, index)
            for value in results:
                owner = owner_of(value, value)
                made.setdefault(owner, index)
                held = members_last.get(owner, -1)
                read = last_read(value, index)
                members_last[owner] = read if read > held else held

    def _in_place(self, task: Task, index: int) -> None:
        """`task`'s one result owned by the first operand it may overwrite (`_overwritable`):
        one that nothing reads afterwards, made in the same phase, of the same bytes and layout
        (the result's own, found once for all its operands)."""
        result = task.op.results[0]
        root, made, keep, layouts = self.root, self.made, self.keep, self.layouts
        free = result not in keep
        size, layout = -1, None
        for value in _overwritable(task):
            owner = root.get(value, value)
            if not ((free and owner not in keep and owner in made) or self._carried(result, owner)):
                continue
            if self.members_last.get(owner, self.last.get(owner, -1)) > index:
                continue
            if self.phase_of is not None and (
                self.phase_of(made.get(owner, index)) != self.phase_of(index)
            ):
                continue
            if size < 0:
                size, layout = result.nbytes, layouts.get(result)
            held = layouts.get(owner)
            if owner.nbytes == size and (held is layout or held == layout):
                root[result] = owner
                self.equal.spoil(owner)  # it holds the result now, no longer the constant
                return

    def _carried(self, result: Value, owner: Value) -> bool:
        """Whether `result` becomes `owner` next trip of a loop (see `_roots`)."""
        return bool(self.carried) and self.carried.get(result) == owner


# The ops whose one result may overwrite an operand (`_overwritable`).
_IN_PLACE = ELEMENTWISE | FUSIONS


# Constants up to this many elements are compared by value (a model's scalars and small tables);
# larger ones, rare and costly to compare, each keep their own storage.
_COMPARED_CONSTANT = 4096


class _EqualConstants:
    """The first of each set of equal constants (value, type and tiles), which XLA's
    common-subexpression elimination makes one tensor before Poplar places it: the later ones
    share its storage (a model's 96 layers share their epsilons and halves rather than each
    keeping its own on a tile)."""

    def __init__(self, program: Program) -> None:
        self.layouts = program.layouts
        self.first: dict[tuple, Value] = {}
        self.key_of: dict[Value, tuple] = {}

    def twin(self, task: Task) -> Value | None:
        """An earlier constant equal to the one `task` makes, if it makes one; else None."""
        if task.op.name != "constant" or len(task.op.results) != 1:
            return None
        (result,) = task.op.results
        data = np.asarray(task.op.attrs["value"])
        if data.size > _COMPARED_CONSTANT:
            return None
        key = (result.dtype.str, result.shape, data.tobytes(), self.layouts.get(result))
        first = self.first.setdefault(key, result)
        if first is not result:
            return first
        self.key_of[result] = key  # only a first can be spoiled: later ones are not stored
        return None

    def spoil(self, value: Value) -> None:
        """`value`'s storage was overwritten in place: later equal constants keep their own."""
        key = self.key_of.pop(value, None)
        if key is not None and self.first.get(key) is value:
            del self.first[key]


def storage_owners(program: Program, phases: PhaseBounds | None = None) -> dict[Value, Value]:
    """Each value whose bytes another value owns (a view, an in-place result), with its owner."""
    return _roots(program, phases)


def _overwritable(task: Task) -> tuple[Value, ...]:
    """The operands an op may write its one result over: any of an elementwise op's, the
    tensor a dynamic update writes into."""
    if len(task.op.results) != 1 or task.aliases:
        return ()
    if task.op.name in ELEMENTWISE or task.op.name in FUSIONS:
        return task.inputs
    if task.op.name == "dynamic_update_slice":
        return task.inputs[:1]
    return ()


def _last_reads(program: Program) -> dict[Value, int]:
    last = {value: index for index, task in enumerate(program.tasks) for value in task.reads}
    for value in program.outputs:
        last[value] = len(program.tasks)  # read by the host
    return last


Uses = tuple[dict[Value, int], dict[Value, list[int]], set[Value]]


def value_uses(
    program: Program,
    phases: PhaseBounds | None = None,
    carried: Mapping[Value, Value] | None = None,
) -> Uses:
    """Each storage owner's defining task, the tasks that read it, and the constants. They
    depend on the tasks' ops, not on their plans: a caller that asks `tile_memory` again about
    a program whose matmuls it re-planned passes them back (`uses=`) rather than paying a
    pass over every task again (a second for GPT-3's 100,000)."""
    owners = _Owners(program, phases, carried)
    owner_of = owners.root.get
    reads: dict[Value, list[int]] = {}
    for index, task in enumerate(program.tasks):
        for value in task.reads:
            owner = owner_of(value, value)
            held = reads.get(owner)
            if held is None:
                reads[owner] = [index]
            else:
                held.append(index)
    end = max(0, len(program.tasks) - 1)
    for value in program.outputs:
        reads.setdefault(owner_of(value, value), []).append(end + 1)  # read by the host
    made, constants = owners.made, owners.constants
    return made, reads, constants


def _spans(first: int, uses: list[int], phases: PhaseBounds | None) -> tuple[tuple[int, int], ...]:
    """On chip from `first` to the last use; phased, only in the phases that use it, and from
    the start of each such phase (a load) to its last use there. A value read after its phase
    (by a later phase, or by the host: a program output) is stored to streaming memory at the
    end of the phase that makes it, so it stays on chip until then."""
    end = max(uses, default=first)
    if phases is None:
        return ((first, end),)
    phase_of, bounds = phases.phase_of, phases.bounds
    made_phase = phase_of(first)
    lo, hi = bounds[made_phase]
    if end < hi and min(uses, default=first) >= lo:  # read only in the phase that makes it
        return ((first, end),)
    last_task = bounds[-1][1] - 1
    stored = any(u > last_task or phase_of(u) != made_phase for u in uses)
    last_use: dict[int, int] = {}  # per phase, its last task that uses the value
    for task in [first, *(u for u in uses if u <= last_task)]:
        phase = phase_of(task)
        if task > last_use.get(phase, -1):
            last_use[phase] = task
    spans = []
    for phase in sorted(last_use):
        lo, hi = bounds[phase]
        start = first if phase == made_phase else lo  # made here, or loaded at the start
        stop = min(last_use[phase], hi - 1)
        if stored and phase == made_phase:
            stop = max(stop, hi - 1)
        spans.append((start, stop))
    return tuple(spans)


def storages(
    program: Program,
    phases: PhaseBounds | None = None,
    kept: frozenset[Value] = frozenset(),
    ways: Mapping[Value, int] | None = None,
    uses: Uses | None = None,
) -> tuple[Storage, ...]:
    """Every owned tensor's storage; `kept` activations stay on chip from the task that makes
    them to their last reader even across phases, and `ways` holds some as shards. `uses` is
    `value_uses(program, phases)` when the caller has it."""
    made, reads, constants = uses if uses is not None else value_uses(program, phases)
    inputs = set(program.inputs)
    streamed = streamed_inputs(program)
    sliced = sliced_reads(program, phases, reads)
    # A set filled in the layouts' order: its order is the storages', which the report's
    # largest tensors keep among equals. One membership test per layout.
    owners = set(filter((made.keys() | inputs).__contains__, program.layouts))
    layouts, ways = program.layouts, ways or {}
    found = []
    for value in owners:
        always = value in constants or (value in inputs and phases is None)
        if value in inputs:
            slices = sliced.get(value, {})
            read_at = [u for u in reads.get(value, []) if u not in slices]
            first = min(read_at, default=0)
            spans = _spans(first, read_at, phases) if phases is not None else ((0, 0),)
            if (phases is not None and not read_at) or value in streamed:
                spans, always = (), False
        else:
            first = made[value]
            spans = _spans(first, reads.get(value, []), None if value in kept else phases)
        found.append(Storage(value, layouts[value], spans, always, ways.get(value, 1)))
    return tuple(found)


def with_ways(found: Sequence[Storage], ways: Mapping[Value, int]) -> tuple[Storage, ...]:
    """`storages(..., ways=ways)` from `found`, what the same call made without `ways`: only
    the values held as shards (replicated tensor sharding's) hold a share of their bytes."""
    if not ways:
        return tuple(found)
    return tuple(
        dataclasses.replace(s, ways=ways[s.value]) if s.value in ways else s for s in found
    )


def with_kept(
    found: Sequence[Storage],
    kept: frozenset[Value],
    phases: PhaseBounds,
    uses: Uses,
) -> tuple[Storage, ...]:
    """`storages(program, phases, kept, ways, uses)` from `found`, what the same call made
    without `kept`: only the kept activations' spans differ (on chip from the task that makes
    each to its last reader), so a re-sweep after choosing them pays for those alone."""
    made, reads, _ = uses
    return tuple(
        dataclasses.replace(s, spans=_spans(made[s.value], reads.get(s.value, []), None))
        if s.value in kept and s.value in made
        else s
        for s in found
    )


# What a task loads of an input it only slices: (bytes of one load, how many loads).
Loads = tuple[int, int]


def sliced_reads(
    program: Program, phases: PhaseBounds | None, reads: Mapping[Value, list[int]]
) -> dict[Value, dict[int, Loads]]:
    """Per input, the tasks that read slices of it in the phases where nothing reads it
    whole, each with what it loads. A phased program keeps its inputs in streaming memory and
    loads what a phase reads: of an input the phase only slices (weights stacked over the
    layers, read `ws[i]`, or by a scan), the slices alone, as PopXL loads one entry of a remote
    buffer (at an offset a tensor holds, for a dynamic slice); the input is not on chip. A
    slice loads once, or once per trip of the loop laid out inline that takes it; a loop kept
    whole that reads an input one dynamic slice per trip (`_sliced_per_trip`, a scan over
    stacked layers) loads all of it, a slice a trip. `reads`: each storage owner's readers
    (`value_uses`: a view's and a loop's body's reads are their source's)."""
    if phases is None or not phases.slices:
        return {}
    tasks = program.tasks
    inputs = set(program.inputs)
    later: set[Value] | None = None  # what is read after a loop, found when a loop is asked
    slicing: dict[tuple[Value, int], dict[int, Loads]] = {}
    whole: set[tuple[Value, int]] = set()
    for value in inputs:
        # The host's read of an output (past the last task) comes after every phase.
        for index in (i for i in reads.get(value, ()) if i < len(tasks)):
            key = (value, phases.phase_of(index))
            task = tasks[index]
            if later is None and task.op.name == "while":
                later = _read_later(program)
            loads = _slice_loads(task, value, value in program.on_device, later or set())
            if loads is None:
                whole.add(key)
            else:
                slicing.setdefault(key, {})[index] = loads
    found: dict[Value, dict[int, Loads]] = {}
    for (value, phase), sliced in slicing.items():
        if (value, phase) not in whole:
            found.setdefault(value, {}).update(sliced)
    return found


def _slice_loads(task: Task, value: Value, on_device: bool, later: set[Value]) -> Loads | None:
    """What `task` loads of `value` when it reads only slices of it (see `sliced_reads`), or
    None when it reads it whole. A loop streams its slices from streaming memory only when the
    host does not stream them to it (an input kept on the IPUs)."""
    op = task.op
    if op.name in ("slice", "dynamic_slice") and value not in op.operands[1:]:
        return op.results[0].nbytes, task.trips
    if op.name != "while" or not on_device:
        return None
    positions = [p for p, v in enumerate(task.inputs) if v == value]
    if not positions or not all(_sliced_per_trip(op, p, later) for p in positions):
        return None  # read through a view, or whole
    return per_trip_slices(op, positions)


def per_trip_slices(op: Op, positions: Sequence[int]) -> Loads:
    """A loop that reads its operands at `positions` (one tensor) a dynamic slice per trip:
    the bytes of its largest slice, and how many such slices the tensor holds (1 when the
    body slices none)."""
    body = op.regions[1]
    inner = {body.inputs[p] for p in positions}
    pieces = [o.results[0].nbytes for o in body.ops if _slices(o, inner)]
    if not pieces:
        return 0, 1
    piece = max(pieces)
    return piece, max(1, op.operands[positions[0]].nbytes // max(1, piece))


def _slices(op: Op, values: set[Value]) -> bool:
    return op.name == "dynamic_slice" and op.operands[0] in values


def streamed_inputs(program: Program) -> frozenset[Value]:
    """Inputs the host streams a slice at a time: sent every step (not kept on the IPUs,
    `Program.on_device`), read only by loops that pass them on unchanged and read one slice of
    them per trip (a scan's micro-batches). Poplar copies each trip's
    slice from its host stream into the tiles, so the whole never sits on chip; the slices are
    the body's own tensors."""
    loops = [i for i, task in enumerate(program.tasks) if task.op.name == "while"]
    if not loops:  # only a loop streams its input
        return frozenset()
    readers: dict[Value, list[tuple[int, int]]] = {}
    for index, task in enumerate(program.tasks):
        for position, value in enumerate(task.inputs):
            readers.setdefault(value, []).append((index, position))
    outputs = set(program.outputs)
    read_later = _read_later(program)
    looped = {v for i in loops for v in program.tasks[i].inputs}
    return frozenset(
        value
        for value in program.inputs
        if value in looped
        and value not in outputs
        and value not in program.on_device
        and all(_sliced_per_trip(program.tasks[i].op, p, read_later) for i, p in readers[value])
    )


def _read_later(program: Program) -> set[Value]:
    """The values some task or the host reads (a loop's result among them is read after it)."""
    return {v for task in program.tasks for v in task.inputs} | set(program.outputs)


def _sliced_per_trip(op: Op, position: int, read_later: set[Value]) -> bool:
    """Whether `op` is a loop that carries its operand `position` through unchanged, unread
    after the loop and by its test, and reads it in its body only by dynamic slices."""
    if op.name != "while" or position >= len(op.operands) or op.results[position] in read_later:
        return False
    cond, body = op.regions
    inner = body.inputs[position]
    if body.outputs[position] != inner or any(
        cond.inputs[position] in o.operands for o in cond.ops
    ):
        return False
    readers = [o for o in body.ops if inner in op_reads(o)]
    return bool(readers) and all(
        o.name == "dynamic_slice" and inner not in o.operands[1:] for o in readers
    )

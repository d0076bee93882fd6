"""Small all-reduces combined within a phase, as the collective combiner combines them in a
program without phases (`sharding.combine`, docs/target.md "Combined all-reduces").

A phased program cannot combine its all-reduces before its phases exist: replicated tensor
sharding turns each gradient's into a reduce-scatter of its own, and makes all-reduces of its
own that finish a reduction over the replicas' shards (a global norm's sums). Once the phases
and their all-reduces are known, those of one phase over the same axes that wait for the same
earlier all-reduces (so neither waits for the other, whatever order the program lists them in:
a layer norm's sum and sum of squares) go as one ring over the sum of their buffers, one
latency per ring step and one sync, as XLA's all-reduce combiner joins all-reduces no data
path connects. Only the cost changes: the combined step is charged where the group's first
member is, the others' steps are dropped; the tasks, their values and what the runtime runs
stay as they are. All-reduces in a loop laid out inline (charged per trip) are left apart.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from lowering import Value
from partitioner.cost.links import LinkModel
from partitioner.memory.liveness import PhaseBounds
from partitioner.program import Program, Superstep, collective_step


@dataclass(frozen=True, slots=True)
class _Reduce:
    """An all-reduce's step: its task and place in the task's steps, what it may join (its
    phase, axes, group and reduction), its buffer, its bit among its phase's all-reduces and
    the bits of those it waits for (through any path of the phase's tasks)."""

    task: int
    step: int
    key: tuple
    buffer: int
    bit: int
    waits: int


def combine_in_phases(
    program: Program, bounds: PhaseBounds, links: LinkModel, buffer_bytes: int
) -> Program:
    """`program` with the all-reduces of each phase that can run at one point combined, up to
    `buffer_bytes` each (0 keeps them apart)."""
    if buffer_bytes <= 0:
        return program
    groups = [g for g in _groups(_reduces(program, bounds), buffer_bytes) if len(g) > 1]
    if not groups:
        return program
    steps = [list(task.supersteps) for task in program.tasks]
    dropped: set[tuple[int, int]] = set()
    for group in groups:
        first = group[0]
        steps[first.task][first.step] = _combined(program, group, links)
        dropped.update((r.task, r.step) for r in group[1:])
    losing = {task for task, _ in dropped}  # the tasks that lose a step
    tasks = tuple(
        task
        if i not in losing and tuple(s) == task.supersteps
        else dataclasses.replace(
            task, supersteps=tuple(x for j, x in enumerate(s) if (i, j) not in dropped)
        )
        for i, (task, s) in enumerate(zip(program.tasks, steps, strict=True))
    )
    return dataclasses.replace(program, tasks=tasks)


def _reduces(program: Program, bounds: PhaseBounds) -> list[_Reduce]:
    """Every all-reduce step that knows its buffer, outside inline loops, in program order,
    with the all-reduces of its phase it waits for. A path between two all-reduces of a phase
    runs through that phase's tasks alone (phases are runs of the program in order)."""
    found = []
    for phase, (start, stop) in enumerate(bounds.bounds or [(0, len(program.tasks))]):
        waits: dict[Value, int] = {}  # the phase's all-reduces each value waits for
        count = 0
        for index in range(start, stop):
            task = program.tasks[index]
            before = 0
            for value in task.reads:
                before |= waits.get(value, 0)
            mine = 0
            for position, step in enumerate(task.supersteps):
                record = step.collective
                if record is None or record.kind != "all_reduce" or not record.buffer_bytes:
                    continue
                bit, count = 1 << count, count + 1
                mine |= bit
                if task.trips > 1:
                    continue
                op = task.op
                reduction = op.attrs.get("reduction", "sum") if op.name == "all_reduce" else "sum"
                key = (phase, record.axes, record.group_size, reduction)
                found.append(_Reduce(index, position, key, record.buffer_bytes, bit, before))
            if before | mine:
                waits.update(dict.fromkeys(task.op.results, before | mine))
    return found


def _groups(reduces: Sequence[_Reduce], buffer_bytes: int) -> list[list[_Reduce]]:
    """In program order, each joins the first group of its key that the bytes fit, none of
    whose members it waits for, and that waits (through other groups) for no group it waits
    for: so no two groups wait for each other and each group can run at one point of a
    schedule, as XLA's combiner checks reachability. Else it opens a group. Bits and groups
    are a phase's own: no group spans phases."""
    groups: list[list[_Reduce]] = []
    for _, members in itertools.groupby(reduces, key=lambda r: r.key[0]):
        groups += _phase_groups(list(members), buffer_bytes)
    return groups


def _phase_groups(reduces: Sequence[_Reduce], buffer_bytes: int) -> list[list[_Reduce]]:
    groups: list[list[_Reduce]] = []
    by_key: dict[tuple, list[int]] = {}  # each key's groups, in the order they opened
    group_of: dict[int, int] = {}  # an all-reduce's bit -> its group
    masks: list[int] = []  # each group's members' bits
    filled: list[int] = []  # each group's bytes
    needs: list[set[int]] = []  # the groups each group waits for
    for reduce in reduces:
        waited = {group_of[b] for b in _bits(reduce.waits) if b in group_of}
        chosen = next(
            (
                g
                for g in by_key.get(reduce.key, ())
                if filled[g] + reduce.buffer <= buffer_bytes
                and not reduce.waits & masks[g]
                and not _reaches(needs, waited, g)
            ),
            None,
        )
        if chosen is None:
            chosen = len(groups)
            groups.append([])
            masks.append(0)
            filled.append(0)
            needs.append(set())
            by_key.setdefault(reduce.key, []).append(chosen)
        groups[chosen].append(reduce)
        masks[chosen] |= reduce.bit
        filled[chosen] += reduce.buffer
        needs[chosen] |= waited - {chosen}
        group_of[reduce.bit] = chosen
    return groups


def _bits(mask: int) -> list[int]:
    return [1 << i for i in range(mask.bit_length()) if mask >> i & 1]


def _reaches(needs: list[set[int]], start: set[int], target: int) -> bool:
    """Whether any group of `start` waits, directly or through others, for `target`."""
    seen, todo = set(), list(start)
    while todo:
        g = todo.pop()
        if g == target:
            return True
        if g not in seen:
            seen.add(g)
            todo.extend(needs[g])
    return False


def _combined(program: Program, group: Sequence[_Reduce], links: LinkModel) -> Superstep:
    """One ring over the group's buffers together, its work on the chip the members' added up,
    one sync of the group."""
    members = [program.tasks[r.task].supersteps[r.step] for r in group]
    first = members[0]
    assert first.collective is not None
    record = first.collective
    total = sum(r.buffer for r in group)
    ring = links.ring("all_reduce", record.axes, total)
    base = dataclasses.replace(
        first,
        flops=sum(s.flops for s in members),
        exchange_bytes=sum(s.exchange_bytes for s in members),
        compute_cycles=sum(s.compute_cycles for s in members),
        exchange_cycles=sum(s.exchange_cycles for s in members),
    )
    why = f"{record.why.split('; over ')[0]}; {len(group)} all-reduces of a phase combined"
    why = f"{why}; over {ring.route}"
    return collective_step(base, "all_reduce", record.axes, record.group_size, ring, why, total)

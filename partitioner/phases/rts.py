"""Replicated tensor sharding in phased programs, as PopXL schedules Graphcore's GPT-3
(docs/phases.md).

A tensor replicated over some mesh axes is the same on every IPU of them, so streaming memory
keeps only a 1/k share of it per IPU (k the IPUs it is replicated over), and a phase that needs
it whole all-gathers the rest over IPU-Links (`cost.streaming`). Over the replica axes the
optimizer never needs whole tensors: each replica reduce-scatters the gradients instead of
all-reducing them, runs the update's elementwise work on its shard of the weights, gradients
and optimizer state, finishes a reduction over shards (a global norm) with a small AllReduce,
and stores its shards. The program's values do not change; this is how the phases run, and
what the cost model charges for them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lowering import ELEMENTWISE, FUSIONS, Op, Value
from partitioner.cost.links import LinkModel
from partitioner.cost.vector import prologue_cycles
from partitioner.program import LOOP_MARKERS, Program, Superstep, Task, collective_step

# Ops whose work splits over shards of their (non-scalar) operands: elementwise work, and the
# views and transposes between a gradient's layout and its weight's (a reduce-scatter can cut
# the gradient along whichever dimension its shard needs).
_ON_SHARDS = ELEMENTWISE | FUSIONS | {"broadcast_in_dim", "reshape", "transpose", "reduce"}


@dataclass(frozen=True, slots=True)
class Sharded:
    """A phased program under replicated tensor sharding."""

    program: Program  # the same tasks; supersteps on shards recosted
    sizes: Mapping[str, int]  # the mesh
    store_axes: Mapping[Value, tuple[str, ...]]  # the axes a streamed copy is split over
    replica_axes: tuple[str, ...] = ()
    shard_values: frozenset[Value] = frozenset()  # held as 1/replicas shards only
    shard_tasks: frozenset[Task] = frozenset()  # tasks that run on shards
    # A widening conversion's result is streamed as its narrower source and converted again
    # where it is read (cheap work, half the bytes): the value each such result is stored as.
    narrower: Mapping[Value, Value] = dataclasses.field(default_factory=dict)

    @property
    def replicas(self) -> int:
        return math.prod(self.sizes[a] for a in self.replica_axes)

    def stored_bytes(self, value: Value) -> int:
        """The bytes of `value` one IPU keeps in streaming memory."""
        value = self.narrower.get(value, value)
        ways = math.prod(self.sizes[a] for a in self.store_axes.get(value, ()))
        return value.nbytes // ways

    def gather_axes(self, value: Value, readers: Sequence[Task]) -> tuple[str, ...]:
        """The axes a phase gathers a loaded value over: all it is stored split over, but the
        replica axes when every reader in the phase works on shards."""
        axes = self.store_axes.get(value, ())
        if readers and all(t in self.shard_tasks for t in readers):
            return tuple(a for a in axes if a not in self.replica_axes)
        return axes


def unsharded(program: Program) -> Sharded:
    """One IPU: nothing is split in streaming memory."""
    return Sharded(program, {}, {}, narrower=narrower_sources(program))


def narrower_sources(program: Program) -> dict[Value, Value]:
    """Results of widening conversions, each with the narrower value it converts."""
    return {
        t.op.results[0]: t.inputs[0]
        for t in program.tasks
        if t.op.name == "convert" and t.op.results[0].nbytes > t.inputs[0].nbytes
    }


def store_axes(
    values: Sequence[Value], varying: Mapping[Value, frozenset[str]], axis_names: Sequence[str]
) -> dict[Value, tuple[str, ...]]:
    """Each value's streamed copy is split over every mesh axis it is replicated over."""
    out = {}
    # Once per distinct set of varying axes: GPT-3's 240,000 values have a handful.
    split_over: dict[frozenset[str], tuple[str, ...]] = {}
    for value in values:
        held = varying.get(value, frozenset())
        axes = split_over.get(held)
        if axes is None:
            axes = split_over[held] = tuple(a for a in axis_names if a not in held)
        if axes:
            out[value] = axes
    return out


def shard_phases(
    program: Program,
    varying: Mapping[Value, frozenset[str]],
    sizes: Mapping[str, int],
    replica_axes: Sequence[str],
    links: LinkModel,
) -> Sharded:
    """The phased program with its gradients reduce-scattered and its updates on shards."""
    values = [*program.inputs, *(v for t in program.tasks for v in t.op.results)]
    axes = store_axes(values, varying, tuple(sizes))
    replicas = math.prod(sizes[a] for a in replica_axes)
    narrower = narrower_sources(program)
    if replicas <= 1:
        return Sharded(program, dict(sizes), axes, narrower=narrower)
    reps = frozenset(replica_axes)
    gradients = _gradient_reductions(program, reps, replicas)
    readers = _readers(program)
    on_shards, sinks = _shard_tasks(program, varying, reps, gradients, replicas, readers)
    converted = {
        t
        for t in gradients
        if all(r in on_shards or r in sinks for v in t.op.results for r in readers.get(v, []))
    }
    shard_values = frozenset(v for t in (*on_shards, *converted) for v in t.op.results)
    shard_sinks = {t for t in sinks if any(v in shard_values for v in t.inputs)}
    finishing = _finishing(program, shard_sinks)
    recost = _Recost(replicas, tuple(replica_axes), links, prologue_cycles(links.target))
    touched = converted | on_shards | shard_sinks | finishing.keys()  # the rest keep their steps
    tasks = tuple(
        recost.task(t, t in converted, t in on_shards or t in shard_sinks, finishing.get(t))
        if t in touched
        else t
        for t in program.tasks
    )
    swapped = dict(zip(program.tasks, tasks, strict=True))
    shard_tasks = frozenset(swapped[t] for t in (*on_shards, *shard_sinks))
    recosted = dataclasses.replace(program, tasks=tasks)
    return Sharded(
        recosted, dict(sizes), axes, tuple(replica_axes), shard_values, shard_tasks, narrower
    )


# Ops linear in a sum over the replicas: applied to partial sums (and to whole values, which a
# program would fold in once), they leave a partial sum, so one AllReduce still finishes it.
_LINEAR = frozenset({"add", "subtract", "negate", "convert", "reshape", "broadcast_in_dim"})
_SCALING = frozenset({"multiply", "divide"})  # linear in one operand: the first, for divide


def _keeps_pending(task: Task, pending: set[Value]) -> bool:
    return _op_keeps_pending(task.op, pending)


def _op_keeps_pending(op: Op, pending: set[Value]) -> bool:
    """Whether `op`'s results stay partial sums when it reads `pending` ones; a fusion's when
    every member that reads one keeps it pending."""
    if op.name in FUSIONS:
        region = op.regions[0]
        inner = {i for i, v in zip(region.inputs, op.operands, strict=True) if v in pending}
        for member in region.ops:
            if inner.intersection(member.operands):
                if not _op_keeps_pending(member, inner):
                    return False
                inner.update(member.results)
        return True
    name = op.name
    read = [v in pending for v in op.operands]
    if name in _LINEAR:
        return True
    if name == "multiply":
        return sum(read) == 1
    return name == "divide" and read == [True, False]


def _finishing(program: Program, sinks: set[Task]) -> dict[Task, int]:
    """Reductions over shards leave partial sums over the replicas; linear work on them keeps
    them pending, and the first task that needs one whole (a global norm's square root)
    finishes it with one small AllReduce: those tasks, with the bytes they all-reduce."""
    pending = {v for t in sinks for v in t.op.results}
    finishing: dict[Task, int] = {}
    for task in program.tasks:
        if task.op.name in LOOP_MARKERS:  # a loop's values passed on, pending or not
            passed = zip(task.inputs, task.op.results, strict=True)
            pending.update(out for value, out in passed if value in pending)
            continue
        if pending.isdisjoint(task.inputs):
            continue
        read = [v for v in task.inputs if v in pending]
        if _keeps_pending(task, pending):
            pending.update(task.op.results)
        else:
            finishing[task] = sum(v.nbytes for v in read)
    return finishing


def _gradient_reductions(program: Program, reps: frozenset[str], replicas: int) -> set[Task]:
    """Sums over exactly the replica axes of tensors that split over the replicas: the
    gradients (a scalar loss is summed whole)."""
    return {
        t
        for t in program.tasks
        if t.op.name == "all_reduce"
        and frozenset(t.op.attrs["axes"]) == reps
        and t.op.attrs.get("reduction", "sum") == "sum"
        and t.op.results[0].size >= replicas
    }


def _readers(program: Program) -> dict[Value, list[Task]]:
    readers: dict[Value, list[Task]] = {}
    for task in program.tasks:
        for value in task.reads:
            held = readers.get(value)
            if held is None:
                readers[value] = [task]
            else:
                held.append(task)
    return readers


def _is_sink(task: Task, replicas: int) -> bool:
    """A reduction whose result is too small to split over the replicas: over shards it leaves
    a partial sum (a reduction that keeps a dimension to split keeps its result a shard)."""
    return task.op.name == "reduce" and task.op.results[0].size < replicas


def _shard_tasks(
    program: Program,
    varying: Mapping[Value, frozenset[str]],
    reps: frozenset[str],
    gradients: set[Task],
    replicas: int,
    readers: Mapping[Value, list[Task]],
) -> tuple[set[Task], set[Task]]:
    """Tasks that can run on shards: elementwise work on gradients, on arguments replicated
    over the replica axes and on what they make, when every reader can too (or the value is
    an output, stored as shards); and reductions of such values to scalars (sinks), whose
    partial sums a small AllReduce finishes. Decided readers first, in reverse program order;
    `readers` are each value's reading tasks (`_readers`)."""
    outputs = set(program.outputs)
    candidate = _candidates(program, varying, reps, gradients, replicas)
    on_shards: set[Task] = set()
    sinks = {t for t in candidate if _is_sink(t, replicas)}
    for task in reversed(program.tasks):
        if task not in candidate or task in sinks:
            continue
        if all(
            v in outputs or all(r in on_shards or r in sinks for r in readers.get(v, []))
            for v in task.op.results
        ):
            on_shards.add(task)
    return on_shards, sinks


def _candidates(
    program: Program,
    varying: Mapping[Value, frozenset[str]],
    reps: frozenset[str],
    gradients: set[Task],
    replicas: int,
) -> set[Task]:
    """Tasks whose every input but scalars could be held as shards: a gradient, an argument
    replicated over the replica axes, or what such tasks make (a broadcast of a scalar too)."""
    shardable = {v for v in program.inputs if not reps & varying.get(v, frozenset())}
    for t in gradients:
        shardable.update(t.op.results)
    found: set[Task] = set()
    for task in program.tasks:
        if task.op.name not in _ON_SHARDS:
            continue
        # Membership before size: an input not held as shards settles it, its size unasked.
        if not all(v in shardable or v.size <= 1 for v in task.inputs):
            continue
        if task.op.name != "reduce" or any(v.size > 1 for v in task.inputs):
            found.add(task)
            if not _is_sink(task, replicas):
                shardable.update(task.op.results)
    return found


@dataclass(frozen=True, slots=True)
class _Recost:
    """Supersteps of work done on 1/replicas shards."""

    replicas: int
    axes: tuple[str, ...]
    links: LinkModel
    prologue: int  # `prologue_cycles` of the target: the compute cycles no split shortens
    # `_less`'s steps by every field: GPT-3's 17,000 steps on shards are 1,400 distinct ones.
    _lessened: dict[tuple, Superstep] = dataclasses.field(
        default_factory=dict, compare=False, repr=False
    )

    def task(self, task: Task, scatter: bool, on_shards: bool, finish: int | None) -> Task:
        steps = task.supersteps
        if scatter:
            steps = (self._reduce_scatter(task),)
        elif on_shards:
            steps = tuple(self._less(s) for s in steps)
        if finish is not None:
            steps = (self._all_reduce(finish, task), *steps)
        return task if steps == task.supersteps else dataclasses.replace(task, supersteps=steps)

    def _split(self, cycles: int, fixed: int) -> int:
        """A step's cycles with its variable part split over the replicas."""
        if cycles <= fixed:
            return cycles
        return fixed + math.ceil((cycles - fixed) / self.replicas)

    def _less(self, step: Superstep) -> Superstep:
        """`step` on 1/replicas shards."""
        key = (step, step.start, step.busiest_tile_bytes, step.collective)
        less = self._lessened.get(key)
        if less is None:
            less = self._lessened[key] = self._on_shards(step)
        return less

    def _on_shards(self, step: Superstep) -> Superstep:
        t = self.links.target
        return dataclasses.replace(
            step,
            flops=math.ceil(step.flops / self.replicas),
            exchange_bytes=math.ceil(step.exchange_bytes / self.replicas),
            compute_cycles=self._split(step.compute_cycles, self.prologue),
            exchange_cycles=self._split(step.exchange_cycles, t.exchange_overhead_cycles),
            busiest_tile_bytes=math.ceil(step.busiest_tile_bytes / self.replicas),
        )

    def _all_reduce(self, nbytes: int, task: Task) -> Superstep:
        """The AllReduce over the replicas that finishes partial sums of shards."""
        ring = self.links.ring("all_reduce", self.axes, nbytes)
        base = Superstep("", "all_reduce", str(task.op.loc), 1, 0, 0, 0, 0, 0)
        why = (
            "replicated tensor sharding: reductions over the replicas' shards finish "
            f"before {task.op.name}; over {ring.route}"
        )
        return collective_step(base, "all_reduce", self.axes, self.replicas, ring, why, nbytes)

    def _reduce_scatter(self, task: Task) -> Superstep:
        """A gradient's AllReduce over the replicas as a ReduceScatter: each replica keeps the
        shard it updates."""
        (step,) = task.supersteps
        assert step.collective is not None
        buffer = task.op.operands[0].nbytes
        ring = self.links.ring("reduce_scatter", self.axes, buffer)
        why = f"{step.collective.why}; replicated tensor sharding keeps each replica's shard"
        group = step.collective.group_size
        less = self._less(step)
        return collective_step(less, "reduce_scatter", self.axes, group, ring, why, buffer)

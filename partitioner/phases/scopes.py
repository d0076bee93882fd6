"""Splitting by name, as PopXL runs Graphcore's GPT-3: one forward and one backward phase per
block, then optimizer phases (docs/phases.md). The blocks are `jax.named_scope`s, given
(`phases=["layer0", ...]`) or the program's own (`scope_blocks`, with `phases="auto"`: each
task's first scope below those every scoped task shares, such as a flax model's top module,
when each name runs as one group per pass). When its scopes name no blocks (it has none, or
a library gives every layer the same names, as equinox's `eqx.nn.Linear`), the blocks come
from the program's structure (`blocks`): `block0`, ..., `prologue`, `epilogue`, names that can
be given as scopes' are.

- a task belongs to the block of the `jax.named_scope` it sits in, forward or backward: jax
  names the backward ops of a scope `transpose(jvp(layer0))`. Every task of one block and
  direction is one phase, wherever it sits in program order, so the micro-batches of an
  unrolled gradient accumulation share their layer's phases (phase-major, as PopXL runs them).
  Phases run in the order their blocks first appear; if that order would run a task before
  something it reads (a scope reused further on), each contiguous run of a block is a phase.
- a task in no named scope joins the latest phase that makes one of its operands. When that
  phase comes after the last phase of the block the task belongs with (its home: the block of
  its largest operand, e.g. a weight's update belongs with the weight's layer), the task goes to
  that block's optimizer phase instead, after every backward phase: an optimizer that needs the
  global gradient norm updates each layer in a phase of its own, as PopXL's does. Scalars stay
  where they are made. Views and sources (broadcasts, iotas, constants), widening conversions
  and tasks that read only arguments join their first reader's phase.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from lowering import Value
from partitioner.memory.liveness import PhaseBounds
from partitioner.phases.blocks import structure_labels
from partitioner.phases.plan import PhasePlan
from partitioner.program import LOOP_MARKERS, Program, Task

TINY_BYTES = 4096  # results this small (norms, scales) stay in the phase that makes them
# Views and sources: Poplar makes them where they are read, so they run in their reader's phase.
FLOATING = frozenset({"broadcast_in_dim", "iota", "constant"})
# Names in jax's name stack that are not the user's scopes.
_JAX_NAMES = frozenset(
    {"jvp", "transpose", "vmap", "checkpoint", "rematted_computation", "remat", "while", "body"}
)
FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer"


# ---- scopes ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1 << 16)
def _words(scope: str) -> tuple[str, ...]:
    """The user's scope names in a name-stack path, transformation wrappers opened
    (`jit(step)/transpose(jvp(layer0))/dot_general` -> ("layer0",)); jit roots and the primitive
    (the last element) are not scopes, nor the specs `jnp.einsum` names its ops by
    (`btd,dhck->bthck`). Cached: tasks share a few thousand paths (GPT-3: 250,000 asks)."""
    parts = scope.split("/")[1:-1]
    words: list[str] = []
    for part in parts:
        if part.startswith(("jit(", "pjit(")):
            continue
        words += [w for w in re.split(r"[()]", part) if w and w not in _JAX_NAMES and "->" not in w]
    return tuple(words)


def direction(scope: str) -> str:
    return BACKWARD if "transpose(" in scope else FORWARD


def scope_blocks(program: Program) -> list[str]:
    """The program's blocks for `phases="auto"`, in order of first appearance: its own named
    scopes when each runs as one group per pass (`_named`); otherwise the blocks its structure
    repeats (`blocks.structure_labels`); otherwise its scopes whatever they are, or none."""
    named = _named(program)
    if named and _assign(program, block_labels(program, named), contiguous=False)[0] is not None:
        return named
    return _structure_blocks(program, named)


def _structure_blocks(program: Program, named: list[str]) -> list[str]:
    found = dict.fromkeys(label for label in structure_labels(program) if label is not None)
    return list(found) or named


def split_by_scope_blocks(program: Program) -> tuple[Program, PhasePlan] | None:
    """`split_by_names(program, scope_blocks(program))`, None when there are no blocks: the
    named scopes' labels and phases, found once for both (GPT-3: a second per pass)."""
    named = _named(program)
    if named:
        labels = block_labels(program, named)
        phase_of, keys = _assign(program, labels, contiguous=False)
        if phase_of is not None and any(labels):
            return _reordered(program, phase_of, [_title(k, keys) for k in keys])
        if phase_of is not None:
            return split_by_names(program, named)  # raises, as split_by_names would
    blocks = _structure_blocks(program, named)
    return split_by_names(program, blocks) if blocks else None


def _named(program: Program) -> list[str]:
    """The first scope of each task below the names every scoped task sits in (a flax model's
    top module, which jax may repeat), or the outermost when nothing is below them."""
    # Each distinct path once, which finds the same root and names: GPT-3's 82,000 tasks have
    # 200.
    paths = [words for words in _distinct_words(program) if words]
    root: set[str] = set()
    for column in zip(*paths, strict=False):
        if len(set(column)) > 1:
            break
        root.add(column[0])
    below = (list(itertools.dropwhile(root.__contains__, words)) for words in paths)
    named = dict.fromkeys(rest[0] for rest in below if rest)
    return list(named) or list(dict.fromkeys(words[0] for words in paths))


def _distinct_words(program: Program) -> dict[tuple[str, ...], None]:
    """The tasks' `_words`, each distinct path once, in order of first appearance."""
    scopes = dict.fromkeys(task.op.loc.scope for task in program.tasks)
    return dict.fromkeys(map(_words, scopes))


def block_label(task: Task, names: Sequence[str]) -> str | None:
    words = _words(task.op.loc.scope)
    for name in names:
        if name in words:
            return name
    return None


def block_labels(program: Program, names: Sequence[str]) -> list[str | None]:
    """Each task's `block_label`: the first of `names` (in their order) its scope path holds.
    None of them in any path, the names of blocks found from the program's structure."""
    rank = {name: i for i, name in reversed(list(enumerate(names)))}
    # Once per distinct scope: GPT-3's 82,000 tasks have a few thousand.
    label_of: dict[str, str | None] = {}
    for scope in dict.fromkeys(task.op.loc.scope for task in program.tasks):
        held = [w for w in _words(scope) if w in rank]
        label_of[scope] = min(held, key=rank.__getitem__) if held else None
    labels = [label_of[task.op.loc.scope] for task in program.tasks]
    if not any(labels):
        labels = [label if label in rank else None for label in structure_labels(program)]
    return labels


# ---- splitting by name -------------------------------------------------------------------------


class _Keys:
    """Phase keys (block, kind, run) in phase order, each with its index."""

    def __init__(self, keys: Iterable[Any]) -> None:
        self.keys = list(dict.fromkeys(keys))
        self._at = {key: i for i, key in enumerate(self.keys)}

    def index(self, key: Any) -> int:
        """The key's phase, a new last phase for a key not seen before."""
        if key not in self._at:
            self._at[key] = len(self.keys)
            self.keys.append(key)
        return self._at[key]


def split_by_names(program: Program, names: Sequence[str]) -> tuple[Program, PhasePlan]:
    """One phase per block and direction (phase-major), then optimizer phases; contiguous runs
    when grouping would break the program's order. Tasks are reordered phase by phase."""
    labels = block_labels(program, names)
    if not any(labels):
        raise ValueError(f"no op is in a named scope called any of {list(names)}")
    phase_of, keys = _assign(program, labels, contiguous=False)
    if phase_of is None:
        phase_of, keys = _assign(program, labels, contiguous=True)
    if phase_of is None:
        # An update moved to its optimizer phase is read by a later block (a gradient of
        # weights stacked over the layers, summed layer by layer as the backward pass goes):
        # each update then runs where its operands are ready.
        phase_of, keys = _assign(program, labels, contiguous=True, hoist=False)
    assert phase_of is not None  # contiguous runs, nothing hoisted, keep the program's order
    return _reordered(program, phase_of, [_title(k, keys) for k in keys])


def _keys_in_order(labels: list[str | None], program: Program, contiguous: bool) -> list[Any]:
    """Each named task's (block, direction, run) key."""
    out: list[Any] = []
    runs: dict[tuple[str, str], int] = {}
    last: tuple[str, str] | None = None
    for label, task in zip(labels, program.tasks, strict=True):
        if label is None:
            out.append(None)
            continue
        pair = (label, direction(task.op.loc.scope))
        if contiguous and pair != last:
            runs[pair] = runs.get(pair, -1) + 1
        last = pair
        out.append((*pair, runs.get(pair, 0)))
    return out


def _assign(
    program: Program, labels: list[str | None], contiguous: bool, hoist: bool = True
) -> tuple[list[int] | None, list[Any]]:
    """Each task's phase index, or None when a task would run before what it reads. With
    `hoist`, an unnamed task that waits for a phase after its home block's last (an update)
    moves to the block's optimizer phase; without, it runs in the first phase it may."""
    task_keys = _keys_in_order(labels, program, contiguous)
    keys = _Keys(k for k in task_keys if k is not None)
    named_phases = len(keys.keys)
    homes = home_blocks(program, labels)
    last_of = {key[0]: i for i, key in enumerate(keys.keys)}
    made_in: dict[Value, int] = {}
    made = made_in.get  # phases count from 0: an argument's 0 waits for nothing
    floating: set[Value] = set()  # results of tasks that run in their first reader's phase
    sourced: set[Value] = set()  # of those, the ones made from arguments and constants only
    phase_of: list[int] = []
    for task, key in zip(program.tasks, task_keys, strict=True):
        results = task.op.results
        earliest = max([made(v, 0) for v in task.inputs], default=0)
        if key is not None:
            phase = keys.index(key)
            if phase < earliest:
                return None, keys.keys
        elif (from_sources := _from_sources(task, made_in, sourced)) or _floats(task):
            floating.update(results)
            if from_sources:
                sourced.update(results)
            phase = earliest
        else:
            home = homes.get(results[0]) if results else None
            phase = earliest
            if hoist and home is not None and earliest > last_of[home] and not _tiny(task):
                # It waits for a phase after its home block's last: its optimizer phase, or
                # the next round of them when it also waits for one (an update after a global
                # norm of gradients that are only whole after a loop of micro-batches).
                phase = _optimizer_phase(keys, home, max(earliest, named_phases))
        phase_of.append(phase)
        for value in results:
            made_in[value] = phase
    _float_to_readers(program, phase_of, floating)
    return phase_of, keys.keys


def _optimizer_phase(keys: _Keys, home: str, earliest: int) -> int:
    """The first round of `home`'s optimizer phases at or after `earliest`."""
    round_ = 0
    while (phase := keys.index((home, OPTIMIZER, round_))) < earliest:
        round_ += 1
    return phase


def _floats(task: Task) -> bool:
    """Views and sources, and widening conversions (storing the narrower value streams less):
    they run in their first reader's phase, as do the tasks `_from_sources`."""
    return task.op.name in FLOATING or _widens(task)


def _from_sources(task: Task, made_in: dict[Value, int], sourced: set[Value]) -> bool:
    """Whether `task` reads only arguments, constants and what is made from them alone."""
    return all(v in sourced for v in task.inputs if v in made_in)


def _widens(task: Task) -> bool:
    op = task.op
    return op.name == "convert" and op.results[0].nbytes > op.operands[0].nbytes


def _tiny(task: Task) -> bool:
    return all(v.nbytes <= TINY_BYTES for v in task.op.results)


def home_blocks(program: Program, labels: list[str | None]) -> dict[Value, str]:
    """Each value's home block: a named task's results are its block's; an argument belongs to
    the block that reads it first; an unnamed task's results to the home of its largest operand
    that has one (a broadcast weighs what its source does: it is a view)."""
    homes: dict[Value, str] = {}
    weight: dict[Value, int] = {}
    for task, label in zip(program.tasks, labels, strict=True):
        op, inputs = task.op, task.inputs
        if op.name == "broadcast_in_dim":
            weight[op.results[0]] = weight.get(inputs[0], inputs[0].nbytes)
        if label is not None:
            for value in inputs:
                homes.setdefault(value, label)
            homes.update(dict.fromkeys(op.results, label))
            continue
        if op.name in LOOP_MARKERS:  # a loop's values passed on, each keeps its home
            for value, result in zip(inputs, op.results, strict=True):
                if value in homes:
                    homes[result] = homes[value]
            continue
        homed = [v for v in inputs if v in homes]
        if homed:
            home = homes[_heaviest(homed, weight)]
            for value in op.results:
                homes[value] = home
    return homes


def _heaviest(values: list[Value], weight: dict[Value, int]) -> Value:
    """The first of `values` with the most bytes (`weight`'s for a broadcast)."""
    if len(values) == 1:  # most tasks: no bytes to weigh
        return values[0]
    return max(values, key=lambda v: weight.get(v, v.nbytes))


def _float_to_readers(program: Program, phase_of: list[int], floating: set[Value]) -> None:
    """Floating tasks run in the first phase that reads them (never before their producers)."""
    readers: dict[Value, int] = {}
    tasks = program.tasks
    for index in range(len(tasks) - 1, -1, -1):
        task = tasks[index]
        results = task.op.results
        if results and results[0] in floating:
            later = [readers[v] for v in results if v in readers]
            phase_of[index] = max(phase_of[index], min(later, default=phase_of[index]))
        phase = phase_of[index]
        for value in task.inputs:
            first = readers.get(value)
            if first is None or phase < first:
                readers[value] = phase


def _title(key: Any, keys: list[Any]) -> str:
    block, kind, run = key
    runs = sum(1 for k in keys if k[:2] == (block, kind))
    title = block if kind == FORWARD else f"{block} ({kind})"
    if kind == OPTIMIZER and runs > 1:  # rounds: the gradients' norm, then the update
        return f"{block} (optimizer {run + 1})"
    return f"{title} [{run + 1}]" if runs > 1 else title


def _reordered(
    program: Program, phase_of: list[int], titles: list[str]
) -> tuple[Program, PhasePlan]:
    """Tasks sorted by phase (program order within one), empty phases dropped."""
    order = sorted(range(len(program.tasks)), key=phase_of.__getitem__)  # stable: in order
    tasks = tuple(program.tasks[i] for i in order)
    bounds: list[tuple[int, int]] = []
    names: list[str] = []
    start = 0
    sizes = Counter(phase_of)
    for phase, title in enumerate(titles):
        stop = start + sizes[phase]
        if stop > start:
            bounds.append((start, stop))
            names.append(title)
        start = stop
    plan = PhasePlan(tuple(names), PhaseBounds(bounds))
    return dataclasses.replace(program, tasks=tasks), plan

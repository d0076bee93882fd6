"""Blocks from a program's structure: what `phases="auto"` splits a training step by when its
named scopes do not name its blocks (docs/phases.md, "Phases from structure").

A model repeats its blocks, and jax traces every copy alike: the same ops on operands and
results of the same shapes and types, in the same order. So in each pass over the model (a
run of forward tasks, under jax's `jvp(...)` names, or of backward ones, `transpose(...)`):

- a task's signature is its op's name and its operands' and results' shapes and types;
- the period is the distance at which the most tasks equal the task that far on: each
  signature's distances to its next occurrence vote for candidates, and the best few are
  checked by counting the tasks that match;
- a run of tasks each equal to the one a period on, at least two periods and a quarter of the
  pass long, is a stack of blocks. Where in the period a block starts is where the fewest
  bytes cross its boundaries (a broadcast read counted as a read of its source: a few tasks
  off, a layer norm's statistics would cross too). The gaps around a stack are searched the
  same way for stacks of another period (an encoder's before a decoder's);
- a forward pass's blocks are `block0`, `block1`, ... in program order, the work before them is
  `prologue`, after them `epilogue`, between two stacks `interlude1`, ...; jax's backward runs
  the blocks last first, so a backward pass's segments, reversed, take the labels of the
  forward pass before it. When the two do not line up, a backward segment takes the label of
  the forward segment it shares the most argument bytes (weights) with.

Only forward and backward tasks are labelled; the rest (constants, the optimizer) is unnamed
work, placed as in a program with scopes (`scopes`). A program with no backward gets no blocks
here: cutting by bytes already finds the narrow points of a forward pass.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from lowering import Value
from partitioner.phases.cuts import crossing_at, view_sources
from partitioner.program import Program, Task

CANDIDATES = 8  # periods checked by counting matches, of the distances voted for most
MIN_PERIOD = 2  # tasks in a block


Span = tuple[int, int, bool]  # tasks [start, stop) of a pass, and whether they are a block


# ---- passes and signatures ---------------------------------------------------------------------


def _direction(task: Task) -> str | None:
    scope = task.op.loc.scope
    if "transpose(" in scope:
        return "backward"
    return "forward" if "jvp(" in scope else None


def passes(tasks: Sequence[Task]) -> list[tuple[str, int, int]]:
    """(direction, start, stop): maximal runs of forward or of backward tasks in program order;
    tasks of neither (constants, inlined helpers) inside a run belong to it."""
    out: list[tuple[str, int, int]] = []
    for i, task in enumerate(tasks):
        way = _direction(task)
        if way is None:
            continue
        if out and out[-1][0] == way:
            out[-1] = (way, out[-1][1], i + 1)
        else:
            out.append((way, i, i + 1))
    return out


def signatures(tasks: Sequence[Task]) -> np.ndarray:
    """Each task's op name (a fusion's members too) and operand and result types, as small
    integers."""
    ids: dict[tuple, int] = {}

    def types(values: Sequence[Value]) -> tuple:
        return tuple((v.shape, v.dtype.str) for v in values)

    keys = [
        (t.op.name, t.op.attrs.get("members"), types(t.op.operands), types(t.op.results))
        for t in tasks
    ]
    return np.array(
        [
            _FREE if t.op.name in _SOURCES else ids.setdefault(k, len(ids))
            for t, k in zip(tasks, keys, strict=True)
        ],
        dtype=np.int64,
    )


# Constants and their broadcasts: no work, and where fusion leaves them between a block's few
# tasks, pairs of them would outvote the block's own period. They take no part in the votes.
_SOURCES = frozenset({"constant", "broadcast_in_dim", "iota"})
_FREE = -1


def period(sigs: np.ndarray) -> int | None:
    """The distance at which the most tasks equal the task that far on, or None."""
    last: dict[int, int] = {}
    votes: Counter[int] = Counter()
    for i, sig in enumerate(sigs.tolist()):
        if sig == _FREE:
            continue
        if sig in last:
            votes[i - last[sig]] += 1
        last[sig] = i
    n = len(sigs)
    scored = [
        (int(np.count_nonzero((sigs[:-gap] == sigs[gap:]) & (sigs[gap:] != _FREE))), -gap)
        for gap, _ in votes.most_common(CANDIDATES)
        if MIN_PERIOD <= gap <= n // 2
    ]
    return -max(scored)[1] if scored else None


def stacks(sigs: np.ndarray, every: int) -> list[tuple[int, int]]:
    """[start, stop) of each maximal run of tasks equal to the one `every` on, with the last
    period it matches: at least two blocks each."""
    same = np.concatenate(([False], sigs[:-every] == sigs[every:], [False]))
    edges = np.flatnonzero(np.diff(same.astype(np.int8)))
    return [(a, b + every) for a, b in zip(edges[::2], edges[1::2], strict=True) if b - a >= every]


# ---- blocks of a pass --------------------------------------------------------------------------


def _blocks(stack: tuple[int, int], every: int, cross: np.ndarray) -> list[tuple[int, int]]:
    """The stack's blocks, starting at the offset within the period whose boundaries carry the
    fewest bytes on average."""
    start, stop = stack
    best: tuple[float, int, int] | None = None
    for offset in range(every):
        count = (stop - start - offset) // every
        if count < 2:
            break
        edges = start + offset + every * np.arange(count + 1)
        score = (float(cross[edges].mean()), offset, count)
        best = score if best is None or score < best else best
    assert best is not None  # a stack is at least two periods long
    _, offset, count = best
    first = start + offset
    return [(first + j * every, first + (j + 1) * every) for j in range(count)]


def _spans(sigs: np.ndarray, lo: int, hi: int, cross: np.ndarray, least: float) -> list[Span]:
    """Tasks [lo, hi) as gaps and blocks, alternating: gap, the blocks of a stack, gap, ...; a
    stack counts if it spans `least` tasks (not a pair of ops that happens to repeat). Gaps are
    searched again for stacks of another period (an encoder's before a decoder's) spanning one
    of this stack's blocks or half the gap."""
    every = period(sigs[lo:hi])
    if every is None:
        return [(lo, hi, False)]
    out: list[Span] = []
    at = lo
    for first, stop in stacks(sigs[lo:hi], every):
        first = max(lo + first, at)  # not into the last stack's final block
        if lo + stop - first < max(2 * every, least):
            continue
        blocks = _blocks((first, lo + stop), every, cross)
        out += _gap(sigs, at, blocks[0][0], cross, every)
        out += [(a, b, True) for a, b in blocks]
        at = blocks[-1][1]
    if at == lo:
        return [(lo, hi, False)]
    return out + _gap(sigs, at, hi, cross, every)


def _gap(sigs: np.ndarray, lo: int, hi: int, cross: np.ndarray, every: int) -> list[Span]:
    return _spans(sigs, lo, hi, cross, least=min(every, (hi - lo) / 2))


def segments(tasks: Sequence[Task], sources: dict[Value, Value]) -> list[Span]:
    """A pass as gaps and blocks (`_spans`); none when nothing repeats."""
    sigs = signatures(tasks)
    cross = np.array([*crossing_at(tasks, set(), sources), 0], dtype=np.int64)
    spans = _spans(sigs, 0, len(tasks), cross, least=len(tasks) / 4)
    return spans if len(spans) > 1 else []


# ---- labels ------------------------------------------------------------------------------------


def _forward_labels(spans: list[Span]) -> list[str]:
    """`block0`, ... in order; the gaps `prologue`, `interlude1`, ..., `epilogue`."""
    gaps = [i for i, (_, _, block) in enumerate(spans) if not block]
    names, blocks = [], 0
    for i, (_, _, block) in enumerate(spans):
        if block:
            names.append(f"block{blocks}")
            blocks += 1
        else:
            edge = {gaps[0]: "prologue", gaps[-1]: "epilogue"}
            names.append(edge.get(i, f"interlude{gaps.index(i)}"))
    return names


def _shape(spans: list[Span]) -> list[bool]:
    return [block for _, _, block in spans]


def _read(tasks: Sequence[Task], span: Span, arguments: set[Value]) -> set[Value]:
    return {v for t in tasks[span[0] : span[1]] for v in t.inputs if v in arguments}


def _backward_labels(
    tasks: Sequence[Task],
    segs: list[Span],
    forward: tuple[list[Span], list[str], Sequence[Task]] | None,
    arguments: set[Value],
) -> Sequence[str | None]:
    """The forward pass's labels, in reverse, when the passes line up; otherwise each
    segment's forward segment of the most argument bytes in common (None if none)."""
    if forward is None:
        return [None] * len(segs)
    fsegs, flabels, ftasks = forward
    if _shape(segs)[::-1] == _shape(fsegs):
        return flabels[::-1]
    reads = [_read(ftasks, s, arguments) for s in fsegs]
    out: list[str | None] = []
    for seg in segs:
        mine = _read(tasks, seg, arguments)
        shared = [sum(v.nbytes for v in mine & theirs) for theirs in reads]
        most = max(shared, default=0)
        out.append(flabels[shared.index(most)] if most else None)
    return out


def structure_labels(program: Program) -> list[str | None]:
    """Each task's block, found from the program's structure; all None when the program has
    no backward pass or no pass repeats a block."""
    tasks = program.tasks
    labels: list[str | None] = [None] * len(tasks)
    found = passes(tasks)
    if not any(way == "backward" for way, _, _ in found):
        return labels
    sources = view_sources(tasks)
    arguments = set(program.inputs)
    forward: tuple[list[Span], list[str], Sequence[Task]] | None = None
    for way, a, b in found:
        span = tasks[a:b]
        segs = segments(span, sources)
        if way == "forward":
            names: Sequence[str | None] = _forward_labels(segs)
            forward = (segs, _forward_labels(segs), span) if segs else None
        else:
            names = _backward_labels(span, segs, forward, arguments)
        for (start, stop, _), name in zip(segs, names, strict=True):
            for i in range(a + start, a + stop):
                if _direction(tasks[i]) is not None:
                    labels[i] = name
    if not any(name and name.startswith("block") for name in labels):
        return [None] * len(tasks)
    return labels

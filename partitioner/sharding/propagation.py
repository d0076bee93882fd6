"""Sharding propagation: one algorithm over the per-op factor rules, to a fixed point.

User annotations come first and never change: `in_shardings`, `out_shardings` and
`with_sharding_constraint`. Then, forward and backward over the ops until nothing changes, each
op's factors take axes from the tensors that already have shardings, and tensors that have none
take the factors' axes. Conflicts are resolved in a fixed order that prefers less communication:
1. a user-annotated tensor's axes before a propagated one's;
2. non-reduction factors before reduction factors (sharding a reduction factor costs an
   AllReduce of the result; keeping a batch or row factor sharded costs at most a gather of the
   other operand), unless a user-annotated reduction split would move fewer bytes
   (`_cheaper_with_reductions`);
3. among equals, the larger tensor's axes (moving the smaller one is cheaper);
4. an axis already taken by an earlier factor is skipped.
A propagated (not user-given) sharding stays open: a dimension still whole takes axes that a
later sweep brings, if the tensor does not use them yet, so an early guess never blocks a better
split found further on. Every sharding records its origin, so `Compiled.explain()` can say where
it came from.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from operator import itemgetter

from lowering import Graph, Op, Value
from partitioner.sharding.factor_rules import FACTOR_RULES, Factors
from partitioner.sharding.specs import Axes, Sharding

_MAX_SWEEPS = 8


@dataclass(frozen=True, slots=True)
class Propagated:
    shardings: dict[Value, Sharding]
    origins: dict[Value, str]
    op_factors: dict[Op, tuple[Axes, ...]]  # each factor's axes, per op
    factors: dict[Op, Factors]  # each op's factor rule, as propagation read it


def _candidates(
    op: Op, factors: Factors, known: Mapping[Value, Sharding], fixed: set[Value]
) -> list[tuple[tuple[int, int, int, int], int, Axes]]:
    """(priority, factor, axes) for every known tensor dim that maps to a factor, highest
    priority first: fixed tensors, then non-reduction factors, then larger tensors, then the
    factor's number (ties keep the tensors' order)."""
    found = []
    reduction = factors.reduction
    for values, dims_of in ((op.operands, factors.operands), (op.results, factors.results)):
        for value, dims in zip(values, dims_of, strict=True):
            sharding = known.get(value)
            if sharding is None:
                continue
            origin = 0 if value in fixed else 1
            size = -value.size
            for factor, axes in zip(dims, sharding.dims, strict=False):
                if factor is not None and axes:
                    rank = (origin, 1 if factor in reduction else 0, size, factor)
                    found.append((rank, factor, axes))
    found.sort(key=itemgetter(0))
    return found


def decide_factors(
    op: Op, factors: Factors, known: Mapping[Value, Sharding], fixed: set[Value]
) -> tuple[Axes, ...]:
    return _decide(op, factors, known, _candidates(op, factors, known, fixed))


def _decide(
    op: Op,
    factors: Factors,
    known: Mapping[Value, Sharding],
    candidates: list[tuple[tuple[int, int, int, int], int, Axes]],
) -> tuple[Axes, ...]:
    chosen: list[Axes] = [()] * len(factors.sizes)
    if len(candidates) < 2:  # nothing to conflict with (most ops of a layer)
        for _, factor, axes in candidates:
            chosen[factor] = axes
        return tuple(chosen)
    # An axis may split only one dim of a tensor (a partial sum counts as a use of its axes),
    # so axes are checked per tensor: the operands of a barrier are independent of each other.
    holding = _holders(factors)
    used: list[set[str]] = [set() for _ in range(len(factors.operands) + len(factors.results))]
    skipped: dict[tuple[int, Axes], None] = {}  # in order, each once
    for rank, factor, axes in candidates:
        holders = holding[factor]
        if chosen[factor] or any(used[i] & set(axes) for i in holders):
            if rank[0] == 0 and factor in factors.reduction and not chosen[factor]:
                skipped[(factor, axes)] = None
            continue
        chosen[factor] = axes
        for i in holders:
            used[i] |= set(axes)
    if not skipped:
        return tuple(chosen)
    return _cheaper_with_reductions(op, factors, known, tuple(chosen), list(skipped))


@functools.lru_cache(maxsize=4096)
def _holders(factors: Factors) -> tuple[tuple[int, ...], ...]:
    """For each factor, the op's tensors (operands, then results) it splits; a result holds
    the reduction factors too. By the rule alone: cached, as layers repeat their ops' rules."""
    tensors = [{f for f in dims if f is not None} for dims in factors.operands]
    tensors += [
        {f for f in dims if f is not None} | set(factors.reduction) for dims in factors.results
    ]
    return tuple(
        tuple(i for i, fs in enumerate(tensors) if factor in fs)
        for factor in range(len(factors.sizes))
    )


def _cheaper_with_reductions(
    op: Op,
    factors: Factors,
    known: Mapping[Value, Sharding],
    chosen: tuple[Axes, ...],
    skipped: list[tuple[int, Axes]],
) -> tuple[Axes, ...]:
    """Rule 2 has one exception, by bytes: a user-annotated contraction split that lost its axes
    to another factor takes them back when finishing the partial sum moves fewer bytes than
    gathering the split operands (x @ w split along K with the result wanted split by rows:
    a ReduceScatter of the result rather than AllGathers of x and w)."""
    best, best_bytes = chosen, _moved_bytes(op, factors, known, chosen)
    for factor, axes in skipped:
        swapped = [() if set(a) & set(axes) else a for a in chosen]
        swapped[factor] = axes
        moved = _moved_bytes(op, factors, known, tuple(swapped))
        if moved < best_bytes:
            best, best_bytes = tuple(swapped), moved
    return best


def _moved_bytes(
    op: Op, factors: Factors, known: Mapping[Value, Sharding], axes: tuple[Axes, ...]
) -> float:
    """Bytes the op's known tensors move (as fractions of their size, per IPU, ring closed
    forms without the (n-1)/n) to meet factor axes `axes`: an operand dim losing axes is
    gathered; a partial result is reduce-scattered where its known sharding splits a dim by
    those axes, else all-reduced (twice the bytes)."""
    moved = 0.0
    for value, dims in zip(op.operands, factors.operands, strict=True):
        have = known.get(value)
        if have is None:
            continue
        for dim, factor in enumerate(dims):
            want = axes[factor] if factor is not None else ()
            if have.dims[dim] and want[: len(have.dims[dim])] != have.dims[dim]:
                moved += value.nbytes  # an axis dropped: gathered (adding axes is a slice)
    partial = {a for f in factors.reduction for a in axes[f]}
    if partial:
        for value in op.results:
            have = known.get(value)
            split = have.axes if have is not None else set()
            moved += value.nbytes if partial <= split else 2 * value.nbytes
    return moved


@dataclass
class _State:
    """Propagation's working state. An op is visited again only if one of its tensors changed
    since its last visit (otherwise the visit would change nothing, as deciding and refining
    are deterministic and idempotent), which keeps large programs fast: `stale` holds the ops
    a change touched since their last visit (the changing op itself included, unless its visit
    shows it would decide the same: `_sweep`), and at the start those that touch a seeded
    value: an op none of whose tensors is known decides nothing (most ops of a program, before
    the first sweep reaches them), so it is visited once one is. `touching` holds each value's
    ops, by the value's id (an int hashes without a call into `Value.__hash__`)."""

    known: dict[Value, Sharding]
    origins: dict[Value, str]
    fixed: set[Value]
    factors: dict[Op, Factors]
    touching: dict[int, list[Op]] = field(default_factory=dict)
    stale: set[Op] = field(default_factory=set)
    decided: dict[Op, tuple[Axes, ...]] = field(default_factory=dict)  # at the last visit
    # A visit's decision and offers, by what it read (`_seen`): an op of one layer decides
    # and offers as the same op of every other layer did. Factors are keyed by id:
    # `factors` holds them all while propagation runs.
    decisions: dict[tuple, _Visit] = field(default_factory=dict)

    @classmethod
    def start(
        cls,
        ops: list[Op],
        known: dict[Value, Sharding],
        origins: dict[Value, str],
        fixed: set[Value],
        factors: dict[Op, Factors],
    ) -> _State:
        touching: defaultdict[int, list[Op]] = defaultdict(list)
        for op in ops:
            for value in op.operands:
                touching[value.id].append(op)
            for value in op.results:
                touching[value.id].append(op)
        stale = {op for value in known for op in touching.get(value.id, ())}
        return cls(known, origins, fixed, factors, touching, stale)


def _sweep(ops: list[Op], state: _State) -> bool:
    changed = False
    known, fixed, stale, decisions = state.known, state.fixed, state.stale, state.decisions
    for op in ops:
        if op not in stale:
            continue
        stale.discard(op)
        factors = state.factors[op]
        tensors = (*op.operands, *op.results)
        key = (id(factors), *[_seen(v, known, fixed) for v in tensors])
        visit = decisions.get(key)
        if visit is None:
            candidates = _candidates(op, factors, known, fixed)
            axes = _decide(op, factors, known, candidates)
            offers = _offers(tensors, factors, axes, known, fixed) if any(axes) else ()
            visit = decisions[key] = _Visit(axes, len(candidates), offers)
        state.decided[op] = visit.axes
        if not visit.offers:
            continue  # no factor split, or every tensor holds its axes already
        adopted, refined = _take_offers(op, factors, tensors, visit.offers, state)
        changed |= adopted or refined
        if visit.candidates == 1 and not refined:
            # One candidate decided the op, and the tensors it changed had no sharding: they
            # took its axes as they are, so a visit again would find candidates only for the
            # same factor with the same axes, and decide the same: not stale on their account.
            stale.discard(op)
    return changed


@dataclass(frozen=True, slots=True)
class _Visit:
    """What a visit to an op found (`_sweep`): its factors' axes, how many candidates it
    weighed, and the new shardings its tensors take (`_offers`)."""

    axes: tuple[Axes, ...]
    candidates: int
    offers: tuple[tuple[int, Sharding, bool], ...]


def _seen(value: Value, known: Mapping[Value, Sharding], fixed: set[Value]) -> tuple:
    """What a visit reads of one of the op's tensors (`_candidates`, `_moved_bytes`,
    `_offers`)."""
    s = known.get(value)
    held = None if s is None else (s.dims, s.partial)
    return (held, value in fixed, value.shape, value.dtype)


def _offers(
    tensors: tuple[Value, ...],
    factors: Factors,
    axes: tuple[Axes, ...],
    known: Mapping[Value, Sharding],
    fixed: set[Value],
) -> tuple[tuple[int, Sharding, bool], ...]:
    """The op's factor axes offered to its tensors that are not fixed: (tensor index, its new
    sharding, whether it had none) for each that changes. A tensor the op reads twice sees
    the first offer's sharding at the second, as it would taking them one at a time."""
    offers = []
    now: dict[Value, Sharding] = {}
    for index, (value, dims) in enumerate(
        zip(tensors, (*factors.operands, *factors.results), strict=True)
    ):
        if value in fixed:
            continue
        split = tuple([() if f is None else axes[f] for f in dims])  # `project`'s dims
        if not any(split):
            continue
        current = now.get(value) or known.get(value)
        if current is not None and current.dims == split:
            continue  # nothing to refine (most offers): skip making the record
        made = _refine(current, Sharding(split))
        if made is not None:
            offers.append((index, made, current is None))
            now[value] = made
    return tuple(offers)


def _take_offers(
    op: Op,
    factors: Factors,
    tensors: tuple[Value, ...],
    offers: tuple[tuple[int, Sharding, bool], ...],
    state: _State,
) -> tuple[bool, bool]:
    """The offers taken: whether a tensor that had no sharding took one, and whether one that
    had a sharding was refined."""
    adopted = refined = False
    for index, made, new in offers:
        value = tensors[index]
        state.known[value] = made
        state.origins[value] = f"propagated through {op.name} ({factors.rule}) at {op.loc}"
        state.stale.update(state.touching[value.id])
        if new:
            adopted = True
        else:
            refined = True
    return adopted, refined


def _refine(current: Sharding | None, proposed: Sharding) -> Sharding | None:
    """A propagated sharding only grows: dims still whole take the proposed axes, if those
    axes are not used elsewhere in the tensor (Shardy's open dimensions). None: no change."""
    if current is None:
        return proposed
    if current == proposed:
        return None
    used = current.axes
    dims = list(current.dims)
    for d, (have, want) in enumerate(zip(current.dims, proposed.dims, strict=True)):
        if not have and want and not used & set(want):
            dims[d] = want
            used |= set(want)
    return Sharding(tuple(dims)) if tuple(dims) != current.dims else None


def propagate_shardings(
    graph: Graph,
    inputs: Mapping[Value, Sharding],
    outputs: Mapping[Value, Sharding],
) -> Propagated:
    """Shardings for every value of `graph`; values nothing reaches are replicated."""
    known: dict[Value, Sharding] = {}
    origins: dict[Value, str] = {}
    fixed: set[Value] = set()
    for value, sharding in {**outputs, **inputs}.items():
        known[value] = sharding
        origins[value] = "in_shardings" if value in inputs else "out_shardings"
        fixed.add(value)
    for op in graph.ops:
        if op.name == "sharding_constraint":
            (result,) = op.results
            known[result] = Sharding(op.attrs["dim_axes"])
            origins[result] = f"with_sharding_constraint at {op.loc}"
            fixed.add(result)
        if op.name == "manual_computation":
            _seed_manual(op, known, origins, fixed)
    ops, ties = _with_loop_bodies(graph)
    rules = {op: ties.get(op) or FACTOR_RULES[op.name](op) for op in ops}
    state = _State.start(ops, known, origins, fixed, rules)
    for _ in range(_MAX_SWEEPS):
        forward = _sweep(ops, state)
        backward = _sweep(ops[::-1], state)
        if not (forward or backward):
            break
    replicated: dict[int, Sharding] = {}  # by rank: one record for the many unreached values
    for value in _all_values(graph):
        if value not in known:
            rank = len(value.shape)
            if rank not in replicated:
                replicated[rank] = Sharding.replicated(rank)
            known[value] = replicated[rank]
            origins[value] = "replicated: no sharding reaches it"
    # An op none of whose tensors changed since its last visit decides as it did then (values
    # nothing reached are replicated now, which offers no axes); the others decide again. An
    # op never visited had no sharded tensor: it splits no factor.
    decided, stale = state.decided, state.stale
    op_factors = {
        op: decide_factors(op, state.factors[op], known, fixed)
        if op in stale
        else decided.get(op) or ((),) * len(state.factors[op].sizes)
        for op in ops
        if op not in ties
    }
    factors = {op: f for op, f in state.factors.items() if op not in ties}
    return Propagated(known, origins, op_factors, factors)


def _seed_manual(
    op: Op, known: dict[Value, Sharding], origins: dict[Value, str], fixed: set[Value]
) -> None:
    """A shard_map's results are split as its out_specs say, and its operands are offered its
    in_specs (the partitioner reshards them to those where they differ)."""
    where = f"shard_map at {op.loc}"
    for value, spec in zip(op.results, op.attrs["out_specs"], strict=True):
        known[value], origins[value] = Sharding(tuple(spec)), where
        fixed.add(value)
    for value, spec in zip(op.operands, op.attrs["in_specs"], strict=True):
        if value not in known:
            known[value], origins[value] = Sharding(tuple(spec)), where


def _with_loop_bodies(graph: Graph) -> tuple[list[Op], dict[Op, Factors]]:
    """The ops propagation visits: the graph's, and inside each `while` its condition's and
    body's, joined by ties (identity factor rules) that give a carried value one sharding as the
    loop's operand, its condition's and body's input, its body's output and its result. Sweeps
    to a fixed point then find shardings the body keeps from one trip to the next."""
    ops: list[Op] = []
    ties: dict[Op, Factors] = {}

    def tie(a: Value, b: Value, op: Op) -> None:
        if a != b:
            made = Op(op.name, (a,), (b,), {}, (), op.loc)
            dims = tuple(range(len(a.shape)))
            ties[made] = Factors((dims,), (dims,), a.shape, rule="loop carry")
            ops.append(made)

    for op in graph.ops:
        ops.append(op)
        if op.name != "while":
            continue
        cond, body = op.regions
        for outer, into_cond, into_body in zip(op.operands, cond.inputs, body.inputs, strict=True):
            tie(outer, into_body, op)
            tie(into_body, into_cond, op)
        for region in (cond, body):
            inner, inner_ties = _with_loop_bodies(region)
            ops += inner
            ties.update(inner_ties)
        for out, back, result in zip(body.outputs, body.inputs, op.results, strict=True):
            tie(out, back, op)
            tie(out, result, op)
    return ops, ties


def _all_values(graph: Graph) -> list[Value]:
    values = list(graph.inputs)
    for op in graph.ops:
        values.extend(op.results)
        if op.name == "while":
            for region in op.regions:
                values.extend(_all_values(region))
    return values

"""Partitioning: the global Graph becomes the program each IPU runs (SPMD), with collectives.

Given every value's sharding (`propagation`), each op is rewritten for per-IPU shapes. Its
operands are first resharded to what its factors need, which is where communication appears:
- a partial sum that a consumer needs whole: AllReduce, or ReduceScatter when the consumer wants
  that dimension split over the same axes;
- a dimension split over more axes than needed: AllGather over the extra (minor) axes;
- a dimension split over fewer axes than wanted: each IPU takes its own slice (no traffic).
Sums are left pending as long as they can be (`pending`: an add of partial sums, a view of one,
...), and a scatter-add of updates split over IPUs makes one. A `while` is partitioned as a loop
(`_Partitioner.loop`): its body once, each carried value in one sharding from trip to trip, an
accumulator that starts at zero carried as the partial sum its body leaves it.
A reduction over a dimension padded to divide by its axes first masks the padding to zero. A
split dim read at an offset (a stencil's slices, a pad, a roll) takes the neighbours' edge rows
(`halo_rewrite`). An op whose per-IPU form would be wrong (an uneven reshape) runs whole; a
grouped convolution's groups split over IPUs run with its group counts rewritten, or whole
where the shards would cut a group (`conv_factors`).
Every collective records the op that needed it and why.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from lowering import Graph, Op, Value, max_value_id, producers
from partitioner.sharding.builder import Builder
from partitioner.sharding.conv_factors import FEATURES, uneven_groups
from partitioner.sharding.factor_rules import Dims, Factors, lookup_dim, project, reduction_kind
from partitioner.sharding.halo_rewrite import Halos, Host
from partitioner.sharding.localize import free_values_of, localized_attrs, substitute
from partitioner.sharding.manual import inline_manual
from partitioner.sharding.partitioned import ForcedWhole as ForcedWhole
from partitioner.sharding.partitioned import Partitioned as Partitioned
from partitioner.sharding.pending import pending_axes
from partitioner.sharding.propagation import Propagated
from partitioner.sharding.specs import Axes, Sharding
from partitioner.sharding.windowed import windowed_gathers


def _uses(graph: Graph) -> Counter[Value]:
    """How many times each value is read: by an op, a region of one, or as an output."""
    read: list[Value] = []
    for op in graph.ops:
        read += op.operands
        if op.regions:
            read += free_values_of(op)
    read += graph.outputs
    return Counter(read)


def _axes_of(factors: Factors, axes: tuple[Axes, ...], operand: int, dim: int) -> Axes:
    factor = factors.operands[operand][dim]
    return () if factor is None else axes[factor]


# The shardings and per-IPU shapes of an op's results.
_Form = tuple[tuple[Sharding, ...], tuple[tuple[int, ...], ...]]


# ---- per-op rewriting --------------------------------------------------------------------


class _Partitioner:
    def __init__(
        self,
        graph: Graph,
        prop: Propagated,
        mesh: Mapping[str, int],
        out_required: Mapping[int, Sharding],
        outer: _Partitioner | None = None,
    ) -> None:
        """Partitions `graph`; a loop's region is partitioned by a partitioner whose `outer` is
        the one around it: it sees the values the region captures where that one put them."""
        self.out_required = out_required
        self.graph = graph
        self.prop = prop
        self.mesh = mesh
        self.b: Builder = (
            Builder(mesh, max_value_id(graph) + 1) if outer is None else outer.b.fork()
        )
        self.local: dict[Value, tuple[Value, Sharding]] = {} if outer is None else dict(outer.local)
        self.producers: dict[Value, Op] = producers(graph) | (
            outer.producers if outer is not None else {}
        )
        self.resharded: dict[tuple[Value, Sharding], Value] = (
            {} if outer is None else dict(outer.resharded)
        )
        self.forced: list[ForcedWhole] = []
        self.children: list[_Partitioner] = []
        self.zero_like: set[Value] = set()  # read as zeros: a loop's accumulators, when probed
        self.uses = _uses(graph)
        # The root and the halos' host by weak reference: a partitioner held by its own parts
        # is a cycle, freed only by Python's collector (GPT-3: 157,000 objects a compile).
        self._root: weakref.ref[_Partitioner] = weakref.ref(self) if outer is None else outer._root
        self.hoisted: dict[tuple, Value] = {}  # the root's: values made once, before any loop
        self.halos = Halos(cast(Host, weakref.proxy(self)), graph.ops)
        self.projections: dict[tuple, Sharding] = {} if outer is None else outer.projections
        self.local_shapes: dict[tuple, tuple[int, ...]] = (
            {} if outer is None else outer.local_shapes
        )
        self.forms: dict[tuple, _Form | None] = {} if outer is None else outer.forms

    @property
    def root(self) -> _Partitioner:
        root = self._root()
        assert root is not None, "the root partitioner outlives its regions' partitioners"
        return root

    def operand(self, value: Value, want: Sharding, op: Op, why: str) -> Value:
        """`value` as `want` on this IPU, communicating once per value and sharding: a
        finished partial sum replaces the partial one for every later consumer."""
        x, have = self.local[value]
        if have == want:
            return x
        if (value, want) in self.resharded:
            return self.resharded[(value, want)]
        if have.partial and have.partial != want.partial:
            x, have = self.b.finish_partial(x, have, want, value.shape, op.loc, why)
            if have == want:
                self.resharded[(value, want)] = x
                return x
            if not have.partial and have.dims == self.local[value][1].dims:
                self.local[value] = (x, have)
        x = self.b.reshard(x, have, want, value.shape, op.loc, why)
        self.resharded[(value, want)] = x
        return x

    def run(self) -> Partitioned:
        inputs = self.define_inputs([self.prop.shardings[v] for v in self.graph.inputs])
        for op in self.graph.ops:
            self.rewrite(op)
        outputs, out_shardings = [], []
        for index, value in enumerate(self.graph.outputs):
            want = self.out_required.get(index) or self.prop.shardings[value].without_partial()
            outputs.append(self.operand(value, want, _output_op(value), "an output of the program"))
            out_shardings.append(want)
        local_graph = Graph(
            tuple(inputs),
            tuple(outputs),
            tuple(self.b.ops),
            self.graph.input_names,
            self.graph.in_tree,
            self.graph.out_tree,
            self.graph.name,
        )
        in_shardings = tuple(self.local[v][1] for v in self.graph.inputs)
        local_shardings = {local: sharding for local, sharding in self.local.values()}
        return Partitioned(
            local_graph,
            in_shardings,
            tuple(out_shardings),
            self.graph,
            self.prop,
            local_shardings,
            (*self.all_forced(), *windowed_gathers(self.graph.ops, self.local)),
        )

    def define_inputs(self, shardings: Sequence[Sharding]) -> list[Value]:
        """This IPU's blocks of the graph's inputs, split as `shardings` say."""
        inputs = []
        for value, sharding in zip(self.graph.inputs, shardings, strict=True):
            local = self.b.value(sharding.local_shape(value.shape, self.mesh), value.dtype)
            self.local[value] = (local, sharding)
            inputs.append(local)
        return inputs

    def region(
        self, shardings: Sequence[Sharding], wanted: Sequence[Sharding] | None, why: str = ""
    ) -> tuple[Graph, list[Sharding]]:
        """This partitioner's graph as a loop's region: its inputs split as `shardings`, its
        outputs delivered as `wanted` (None: as they come, partial sums left pending)."""
        inputs = self.define_inputs(shardings)
        for op in self.graph.ops:
            self.rewrite(op)
        if wanted is None:
            outputs = [self.local[v] for v in self.graph.outputs]
        else:
            outputs = [
                (self.operand(v, w, _output_op(v), why), w)
                for v, w in zip(self.graph.outputs, wanted, strict=True)
            ]
        graph = Graph(tuple(inputs), tuple(v for v, _ in outputs), tuple(self.b.ops))
        return graph, [s for _, s in outputs]

    def hoist(self, key: tuple, make: Callable[[Builder], Value]) -> Value:
        """A value every IPU makes from constants and its place in the mesh alone (a halo's
        mask of rows), made once in the outermost program, before any loop that reads it."""
        if key not in self.root.hoisted:
            self.root.hoisted[key] = make(self.root.b)
        return self.root.hoisted[key]

    def rewrite(self, op: Op) -> None:
        if op.name == "while":
            self.loop(op)
            return
        if op.name == "manual_computation":
            inline_manual(self, op)
            return
        if op in self.halos.absorbed:
            return  # a slice that a concatenation with halos reads through
        factors = self.prop.factors[op]
        axes = self.prop.op_factors[op]
        if op.regions and free_values_of(op):
            axes = ()  # regions that read outer values run whole
        if axes:  # a split dim read at an offset: a halo, else gathered
            kept = self.halos.rewrite(op, axes)
            if kept is None:
                return
            axes = kept
        # An op with nothing to split (a scalar's) still keeps a sum pending through it.
        sharded = (axes or self.pending_through(op)) and self.try_sharded(op, factors, axes)
        if not sharded:
            self.whole(op, factors)

    def loop(self, op: Op) -> None:
        """A `while` split as a loop: its body and condition partitioned once, each carried value
        kept from trip to trip in the sharding propagation found for it, and an accumulator
        that starts at zero kept a partial sum across the trips where its body leaves it one
        (gradients accumulated over micro-batches, reduced once after the loop)."""
        cond, body = op.regions
        carried = self.carried_shardings(op)
        why = f"a value the loop at {op.loc} carries"
        operands = [
            self.carried_operand(v, c, op, why) for v, c in zip(op.operands, carried, strict=True)
        ]
        body_graph, _ = self.nested(body).region(carried, carried, why)
        test = [Sharding.replicated(0)]
        cond_graph, _ = self.nested(cond).region(carried, test, f"the test of the loop at {op.loc}")
        regions = (cond_graph, body_graph)
        made = self.b.emit(op.name, operands, dict(op.attrs), op.loc, regions)
        for value, local, sharding in zip(op.results, made, carried, strict=True):
            self.local[value] = (local, sharding)

    def all_forced(self) -> list[ForcedWhole]:
        """The ops run whole here and in the loops' regions partitioned from here."""
        return [*self.forced, *(f for child in self.children for f in child.all_forced())]

    def nested(self, region: Graph) -> _Partitioner:
        child = _Partitioner(region, self.prop, self.mesh, {}, outer=self)
        self.children.append(child)
        return child

    def carried_shardings(self, op: Op) -> list[Sharding]:
        """Each carried value's sharding: propagation's, with the partial sum its body leaves
        on a value that starts at zero. A fixed point: a first probe reads those values as the
        zeros they start as (so adding a partial sum to one keeps it pending); the next probes
        carry the partial sums found, dropping each the body does not keep, until none drops."""
        body = op.regions[1]
        dims = [self.prop.shardings[v].without_partial() for v in body.inputs]
        starts = {
            v for v, operand in zip(body.inputs, op.operands, strict=True) if self.zeros(operand)
        }
        pending = self.left_partial(body, dims, {}, starts) if starts else {}
        while pending:
            kept = self.left_partial(body, dims, pending, set())
            dropped = [i for i in pending if kept.get(i) != pending[i]]
            if not dropped:
                break
            for i in dropped:
                del pending[i]
        return [Sharding(d.dims, pending.get(i, ())) for i, d in enumerate(dims)]

    def left_partial(
        self, body: Graph, dims: list[Sharding], pending: dict[int, Axes], zero_like: set[Value]
    ) -> dict[int, Axes]:
        """The partial sums a probe of the loop's body leaves on its carried values (by index),
        its inputs carried as `dims` with `pending` sums, `zero_like` inputs read as zeros."""
        probe = _Partitioner(body, self.prop, self.mesh, {}, outer=self)
        probe.zero_like = zero_like
        tried = [Sharding(d.dims, pending.get(i, ())) for i, d in enumerate(dims)]
        _, left = probe.region(tried, None)
        return {
            i: s.partial
            for i, (s, d) in enumerate(zip(left, dims, strict=True))
            if s.partial and s.dims == d.dims and (body.inputs[i] in zero_like or i in pending)
        }

    def carried_operand(self, value: Value, carried: Sharding, op: Op, why: str) -> Value:
        """A loop's operand as its carried sharding; zeros are a partial sum as they are."""
        if carried.partial:
            return self.operand(value, carried.without_partial(), op, why)
        return self.operand(value, carried, op, why)

    def try_sharded(self, op: Op, factors: Factors, axes: tuple[Axes, ...]) -> bool:
        axes = self.whole_groups(op, factors, axes)
        form = self.result_form(op, factors, axes)
        if form is None:
            return False
        results, local_shapes = form
        mark = len(self.b.ops)
        pending = self.pending_through(op)
        if pending and set(pending) & {a for f in axes for a in f}:
            pending = ()  # an axis cannot both split a dimension and sum over IPUs
        operands = self.split_operands(op, factors, axes, pending)
        operands = self.mask_reductions(op, factors, axes, operands)
        attrs = localized_attrs(op, local_shapes, operands)
        inferred = self.b.types.infer(op.name, operands, attrs, op.regions, op.loc)
        if [tuple(a.shape) for a in inferred] != list(local_shapes):
            del self.b.ops[mark:]
            return False
        summed = _summed(factors, axes)
        if op.name == "scatter" and summed and not self.zeros(op.operands[0]):
            if not op.operands[0].shape:
                del self.b.ops[mark:]
                return False
            # Every IPU adds its updates into the operand: only the first of the group keeps it.
            operands[0] = self.b.mask(operands[0], 0, summed, operands[0].shape[0], op.loc, "sum")
            inferred = ()  # an operand changed: its types are inferred anew
        partial = pending + summed
        made = self.emit_local(op, factors, axes, operands, attrs, results, inferred)
        kind = reduction_kind(op) if op.name == "reduce" else None
        if partial and kind in ("max", "min"):  # no pending max: finish it now
            why = f"{op.name} ({kind}) at {op.loc} over a split dimension"
            made = (self.b.collective("all_reduce", made[0], partial, op.loc, why, reduction=kind),)
            partial = ()
        for value, local, sharding in zip(op.results, made, results, strict=True):
            self.local[value] = (local, Sharding(sharding.dims, partial) if partial else sharding)
        return True

    def split_operands(
        self, op: Op, factors: Factors, axes: tuple[Axes, ...], pending: Axes
    ) -> list[Value]:
        """`op`'s operands as the factors' axes split them, `pending` sums kept pending."""
        operands = []
        for i, (value, dims) in enumerate(zip(op.operands, factors.operands, strict=True)):
            want = self.project(dims, axes, pending)
            x, have = self.local[value]
            # The reason is spelled out only for an operand that moves: most do not.
            operands.append(
                x if have == want else self.operand(value, want, op, _why(op, factors, i))
            )
        return operands

    # A program has a few shapes, factor rules and splits, and every op asks for its
    # tensors' shardings and per-IPU shapes: each is worked out once per partitioning.

    def project(self, dims: Dims, axes: tuple[Axes, ...], partial: Axes = ()) -> Sharding:
        """`factors.project`."""
        key = (dims, axes, partial)
        found = self.projections.get(key)
        if found is None:
            found = self.projections[key] = project(dims, axes, partial)
        return found

    def result_form(self, op: Op, factors: Factors, axes: tuple[Axes, ...]) -> _Form | None:
        """The shardings and per-IPU shapes of `op`'s results split over `axes`; None for a
        reshape whose blocks would not hold the same elements (an uneven split)."""
        reshaped = op.operands[0].shape if op.name == "reshape" else None
        key = (factors, axes, reshaped, tuple([v.shape for v in op.results]))
        if key not in self.forms:
            self.forms[key] = self._result_form(op, factors, axes)
        return self.forms[key]

    def _result_form(self, op: Op, factors: Factors, axes: tuple[Axes, ...]) -> _Form | None:
        results = tuple(self.project(d, axes) for d in factors.results)
        local_shapes = tuple(
            self.local_shape(s, v.shape) for s, v in zip(results, op.results, strict=True)
        )
        if op.name == "reshape" and math.prod(local_shapes[0]) != math.prod(
            self.local_shape(self.project(factors.operands[0], axes), op.operands[0].shape)
        ):
            return None
        return results, local_shapes

    def local_shape(self, sharding: Sharding, shape: tuple[int, ...]) -> tuple[int, ...]:
        """`sharding.local_shape` on this mesh."""
        key = (sharding.dims, shape)
        found = self.local_shapes.get(key)
        if found is None:
            found = self.local_shapes[key] = sharding.local_shape(shape, self.mesh)
        return found

    def whole_groups(self, op: Op, factors: Factors, axes: tuple[Axes, ...]) -> tuple[Axes, ...]:
        """`axes` with a grouped convolution's groups left whole where its shards
        would split a group: the split operands it gathers are recorded, with why."""
        why = uneven_groups(op, axes, self.mesh)
        if not why:
            return axes
        for value, dims in zip(op.operands, factors.operands, strict=True):
            have = self.local[value][1]
            if any(f == FEATURES and have.dims[d] for d, f in enumerate(dims)):
                tensor = f"{value.type_str} {have}"
                self.forced.append(ForcedWhole(op.name, str(op.loc), factors.rule, tensor, why))
        return tuple(() if f == FEATURES else a for f, a in enumerate(axes))

    def zeros(self, value: Value) -> bool:
        """Whether `value` is all zeros by construction (a zero constant, or its broadcast)."""
        if value in self.zero_like:
            return True
        op = self.producers.get(value)
        if op is not None and op.name == "broadcast_in_dim":
            op = self.producers.get(op.operands[0])
        return op is not None and op.name == "constant" and not np.any(op.attrs["value"])

    def pending_through(self, op: Op) -> Axes:
        """The axes of a sum `op` keeps pending (`pending.pending_axes`): none where no operand
        is a partial sum (most ops), which is quicker to see than to ask."""
        local = self.local
        if not any([local[v][1].partial for v in op.operands]):
            return ()
        return pending_axes(op, lambda v: local[v][1].partial, self.uses, self.zeros)

    def emit_local(
        self,
        op: Op,
        factors: Factors,
        axes: tuple[Axes, ...],
        operands: list[Value],
        attrs: dict,
        results: Sequence[Sharding],
        types: Sequence[Any] = (),
    ) -> tuple[Value, ...]:
        """The op on this IPU's blocks; iotas and table lookups split along the dim they count
        or index need their IPU's offset. `types`: its result types, when already inferred."""
        if op.name == "iota":
            counting = op.attrs["dimension"]
            if results[0].dims[counting]:
                return (self.b.split_iota(op, attrs, results[0].dims[counting]),)
        if op.name in ("gather", "scatter"):
            looked_up = lookup_dim(op)
            if (
                looked_up is not None
                and operands[0].shape[looked_up] != op.operands[0].shape[looked_up]
            ):
                split_axes = _axes_of(factors, axes, 0, looked_up)
                return self.b.split_lookup(op, operands, attrs, looked_up, split_axes)
        if not types:  # else as `Builder.emit` makes it, without inferring the types again
            return self.b.emit(op.name, operands, attrs, op.loc, op.regions)
        return self.b.append(op.name, operands, attrs, op.loc, op.regions, types)

    def mask_reductions(
        self, op: Op, factors: Factors, axes: tuple[Axes, ...], operands: list[Value]
    ) -> list[Value]:
        """Fill the padding of unevenly split reduction dims with the reduction's identity
        (0 for sums and contractions, -inf for max, +inf for min) before it is read."""
        kind = reduction_kind(op) if op.name == "reduce" else "sum"
        for f in factors.reduction:
            if not axes[f] or factors.sizes[f] % self.b.group(axes[f]) == 0:
                continue
            for i, dims in enumerate(factors.operands):
                for dim, factor in enumerate(dims):
                    if factor == f:
                        operands[i] = self.b.mask(
                            operands[i], dim, axes[f], factors.sizes[f], op.loc, kind
                        )
        return operands

    def whole(self, op: Op, factors: Factors) -> None:
        """The op on whole operands, its results replicated on every IPU."""
        captured = free_values_of(op)
        for value in (*op.operands, *captured):
            have = self.local[value][1]
            if any(have.dims):
                tensor = f"{value.type_str} {have}"
                self.forced.append(ForcedWhole(op.name, str(op.loc), factors.rule, tensor))
        operands = [self.gathered(v, op, factors) for v in op.operands]
        regions = op.regions
        if captured:
            mapping = {v: self.gathered(v, op, factors) for v in captured}
            regions = tuple(substitute(r, mapping) for r in op.regions)
        # Whole operands give the global op's own result types: none to infer (GPT-3 runs
        # 20,000 ops whole, most of them constants, whose array attribute cannot key a cache).
        made = self.b.append(op.name, operands, dict(op.attrs), op.loc, regions, op.results)
        for value, local in zip(op.results, made, strict=True):
            self.local[value] = (local, _replicated(len(value.shape)))

    def gathered(self, value: Value, op: Op, factors: Factors) -> Value:
        """`value` whole on every IPU, for `op` run whole."""
        x, have = self.local[value]
        want = _replicated(len(value.shape))
        if have == want:  # most are: why is spelled out only for a value that moves
            return x
        return self.operand(
            value, want, op, f"{op.name} at {op.loc} runs whole ({factors.rule} rule)"
        )


def _summed(factors: Factors, axes: tuple[Axes, ...]) -> Axes:
    """The axes of the partial sums that splitting the reduction factors over `axes` leaves."""
    if not factors.reduction:  # most ops
        return ()
    return tuple(a for f in sorted(factors.reduction) for a in axes[f])


@functools.cache
def _replicated(rank: int) -> Sharding:
    """One record per rank for the many values an op run whole leaves replicated."""
    return Sharding.replicated(rank)


def _why(op: Op, factors: Factors, index: int) -> str:
    return f"operand {index} of {op.name} at {op.loc} ({factors.rule} rule)"


def _output_op(value: Value) -> Op:
    return Op("output", (), (value,))


def partition(
    graph: Graph,
    prop: Propagated,
    mesh: Mapping[str, int],
    out_required: Mapping[int, Sharding] | None = None,
) -> Partitioned:
    """The per-IPU program of `graph` under the propagated shardings; output i is delivered
    as `out_required[i]` where given."""
    return _Partitioner(graph, prop, mesh, out_required or {}).run()

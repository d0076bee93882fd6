"""The plan search's cost-only lowerings: a candidate's program traced once and reused by every
variant of it, and a pipelined candidate traced at its micro-batch alone.

What a candidate's variants change (phases, a pipeline's recomputation) is how the partitioner
builds the program, not the program: they share one trace, kept by `Traces` under the identity
of the step and its arguments (the search makes them once per mesh and depth), the mesh it is
traced under and the micro-batches it is cut into. `ipujax.jit(...).lower(...)` traces a
pipelined step twice, the whole batch and one micro-batch; the partitioner costs the pipeline
from the micro-batch's program, and only running it needs the whole batch's, so costing traces
the micro-batch alone (BERT-Large on a Pod16: 6.7 s of a candidate's 13.5 s of tracing).

A workload made afresh for each mesh (a new step, new arguments) traces alike on meshes whose
arguments have the same shapes: the meshes of one data-parallel width, or a pipeline's micro-batch
whatever its stages. A trace is shared with such a mesh when the step is alike
(`alike.alike_key`: its code and what it captures) and its program reads no mesh axis
(`alike.reads_a_mesh`); `alike` keeps the last few, and a worker keeps them across its jobs
(in one process, GPT-3 175B on a Pod256: 7 traces where there were 31, 10.6 s of CPU where there
were 23.7; BERT-Large on a Pod16: 10 where there were 16, 20.8 s where there were 48.9).

The lowering is `Jitted`'s own; only its trace (`Jitted._traced`) is kept and reused. The
search with `reuse=False` lowers through `ipujax.jit` itself, and
`tests/ipujax/test_plan_reuse.py` holds the two to the same ranking. `pipelined_build` reads
off a pipelined lowering what its compile hands the partitioner, for the bound the search reads
from the staged program before it compiles.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from jax.sharding import AbstractMesh, PartitionSpec

from ipujax.api import Jitted, jit
from ipujax.arguments import Call
from ipujax.microbatch import micro_batch
from ipujax.planning.alike import alike_key, reads_a_mesh, shapes_key
from ipujax.stages import Lowered
from ipujax.tracing import traced
from lowering import Graph
from partitioner import Mesh, Options

# A trace: the program, and for a pipeline its micro-batch's (the same program) and the flat
# inputs that carry the batch.
Trace = tuple[Graph, "tuple[Graph, tuple[int, ...]] | None"]
Specs = tuple[PartitionSpec | None, ...]


SHARED = 8  # traces `Traces.alike` keeps, the oldest dropped first


@dataclass(frozen=True)
class _Shared:
    """A trace kept for steps alike: the mesh it was traced under, and whether its program
    reads a mesh axis (then it is shared only under that mesh)."""

    trace: Trace
    under: AbstractMesh
    reads_mesh: bool


@dataclass
class Traces:
    """The traces the search made, each kept with the objects its key names by identity (so
    no other object takes their ids while it is kept); `made` counts the traces. `alike`
    keeps traces by what the step is (`alike_key`) for meshes that trace the same program; a
    worker passes the same one to each job's `Traces`."""

    kept: dict[Hashable, tuple[Trace, tuple[Any, ...]]] = field(default_factory=dict)
    made: int = 0
    alike: dict[Hashable, _Shared] = field(default_factory=dict)

    def lower(self, fun: Callable[..., Any], args: tuple, jit_kwargs: dict[str, Any]) -> Lowered:
        """`ipujax.jit(fun, **jit_kwargs).lower(*args)` for cost only, its trace reused."""
        return _CostOnly.like(jit(fun, **jit_kwargs), self).lower(*args)

    def trace(
        self,
        key: Hashable,
        held: tuple[Any, ...],
        make: Callable[[], Trace],
        alike: Callable[[], tuple[Hashable, AbstractMesh] | None] = lambda: None,
    ) -> Trace:
        """The trace kept under `key`, else one kept for a step alike (`alike()`: its key and
        the mesh it is traced under, asked only then), else `make()`'s."""
        if key not in self.kept:
            self.kept[key] = self._shared(make, alike()), held
        return self.kept[key][0]

    def _shared(
        self, make: Callable[[], Trace], alike: tuple[Hashable, AbstractMesh] | None
    ) -> Trace:
        if alike is not None:
            found = self.alike.get(alike[0])
            if found is not None and (not found.reads_mesh or found.under == alike[1]):
                return found.trace
        trace = make()
        self.made += 1
        if alike is not None:
            if len(self.alike) >= SHARED:
                del self.alike[next(iter(self.alike))]
            self.alike[alike[0]] = _Shared(trace, alike[1], reads_a_mesh(trace[0]))
        return trace

    def clear(self) -> None:
        self.kept.clear()
        self.alike.clear()


class _CostOnly(Jitted):
    """A `Jitted` whose lowering takes its trace from `Traces` and, pipelined, traces the
    micro-batch alone."""

    def __init__(self, fun: Callable[..., Any], options: Any, traces: Traces) -> None:
        super().__init__(fun, options)
        self._traces = traces

    @classmethod
    def like(cls, jitted: Jitted, traces: Traces) -> _CostOnly:
        return cls(jitted._fun, jitted._options, traces)

    def _traced(self, call: Call, args: tuple, kwargs: dict, traced_under: AbstractMesh) -> Trace:
        """`Jitted`'s trace, kept: a pipeline's micro-batch alone (traced as `ipujax.jit`
        traces it, untyped), else the whole call's."""
        pipeline = self._options.build.pipeline
        if pipeline is None:
            make = lambda: (traced(call.fun, args, kwargs, traced_under), None)  # noqa: E731
            return self._trace(call, traced_under, None, make)
        cut = (pipeline.axis, pipeline.microbatches, pipeline.batch_argnums)
        micro = lambda: _micro_only(micro_batch(call, pipeline, traced_under))  # noqa: E731
        return self._trace(call, traced_under, cut, micro)

    def _trace(
        self, call: Call, under: AbstractMesh, cut: Hashable, make: Callable[[], Trace]
    ) -> Trace:
        """The call's trace, made once for what it depends on: the step, its arguments and
        static values, the shardings (typed into the arguments under Explicit axes), the mesh
        it is traced under and the micro-batching (`cut`); or shared with a step alike."""
        options = self._options
        ids = tuple(map(id, (self._fun, options.in_shardings, *call.args, *call.kwargs.values())))
        key = (ids, tuple(call.kwargs), call.key, under, cut)
        held = (self._fun, options.in_shardings, call.args, call.kwargs)
        return self._traces.trace(key, held, make, lambda: _alike(call, under, cut))


def _alike(call: Call, under: AbstractMesh, cut: Hashable) -> tuple[Hashable, AbstractMesh] | None:
    """The key a step alike is traced under (with the mesh), or None: under Explicit axes the
    shardings type the trace, and a step or argument that cannot be keyed is not shared."""
    if under.explicit_axes:
        return None
    step, shapes = alike_key(call.fun), shapes_key((call.args, call.kwargs))
    if step is None or shapes is None:
        return None
    return (step, shapes, call.key, cut), under


def _micro_only(micro: tuple[Graph, tuple[int, ...]]) -> Trace:
    """A pipelined step's trace for cost only: the micro-batch's program stands for the whole
    batch's, which only running the step reads."""
    return micro[0], micro


def pipelined_build(lowered: Lowered) -> tuple[Graph, Mesh, Specs, Specs, Options]:
    """What `lowered.compile(check_memory_fits=False)` hands `partitioner.build` for a
    pipelined step (`Lowered.build_arguments`): its micro-batch's program on the lowering's
    mesh, with the flat inputs that carry the batch."""
    assert lowered._micro is not None, "a pipelined step's lowering traces its micro-batch"
    return lowered.build_arguments(check_memory_fits=False)

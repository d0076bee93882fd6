"""The partitioner's front door: `partitioner.build` takes a lowered graph, a mesh and specs and
returns the scheduled per-IPU program with its memory and cost, without ipujax; the replica axes
are derived from the shardings; the IR verifier runs after partitioning when asked."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import lowering
import partitioner
import partitioner.passes
from partitioner.sharding.replicas import derive_replica_axes

F32 = np.float32
VERIFY = partitioner.Options(verify=True)


def mlp(w1, w2, x):
    return jnp.tanh(x @ w1) @ w2


def _lowered(batch: int = 8, width: int = 64) -> lowering.Graph:
    w = jax.ShapeDtypeStruct((width, width), F32)
    x = jax.ShapeDtypeStruct((batch, width), F32)
    return lowering.eliminate_dead_code(lowering.lower(mlp, w, w, x))


def _mesh(shape=(2, 2), names=("a", "b")) -> partitioner.Mesh:
    return partitioner.make_mesh(shape, names, target=partitioner.Target.bow().with_tiles(16))


def test_build_returns_the_program_its_memory_and_its_cost() -> None:
    graph = _lowered()
    mesh = _mesh()
    specs = (P(None, "b"), P("b", None), P("a", None))
    built = partitioner.build(graph, mesh, specs, (None,), VERIFY)
    assert built.mesh is mesh and built.partitioned is not None
    assert built.graph is built.partitioned.graph  # the per-IPU program
    assert built.program.tasks and built.memory.total.shape == (16,)
    # The cost is the schedule's own records, summed.
    host_in, *steps, host_out = built.cost.supersteps  # between the host's transfers
    assert (host_in.kind, host_out.kind) == ("host", "host")
    assert tuple(steps) == built.program.supersteps
    assert built.cost.total_cycles == sum(s.cycles for s in built.cost.supersteps)
    assert built.cost.collectives == tuple(
        s.collective for s in built.program.supersteps if s.collective is not None
    )
    assert {c.axes for c in built.cost.collectives} == {("b",)}  # Megatron: one AllReduce
    assert built.replica_axes == ("a",)  # a splits the batch only; b splits the weights


def test_on_one_ipu_nothing_is_partitioned() -> None:
    built = partitioner.build(_lowered(), _mesh((1,), ("x",)), (None,) * 3, (None,), VERIFY)
    assert built.partitioned is None and built.cost.collectives == ()
    assert built.replica_axes == ()


def test_the_replica_axes_are_derived_from_bytes_not_names() -> None:
    graph = _lowered(batch=8, width=64)  # weights 2 x 16 KiB, batch 2 KiB
    inputs = graph.inputs

    def shardings(w1, w2, x):
        return [partitioner.Sharding(d) for d in (w1, w2, x)]

    rep = ((), ())
    # Batch split over "a", weights replicated: "a" is a replica axis.
    assert derive_replica_axes(graph, shardings(rep, rep, (("a",), ())), ("a",)) == ("a",)
    # Weights split over "b" (Megatron), batch replicated over it: not a replica axis.
    megatron = shardings(((), ("b",)), (("b",), ()), ((("a",), ())))
    assert derive_replica_axes(graph, megatron, ("a", "b")) == ("a",)
    # An axis nothing is split over does no parallel work.
    assert derive_replica_axes(graph, shardings(rep, rep, rep), ("a",)) == ()
    # More bytes split than replicated over an axis: not replicas, whatever the name.
    assert sum(v.nbytes for v in inputs[:2]) > inputs[2].nbytes
    weights_over_dp = shardings((("dp",), ()), (("dp",), ()), (("dp",), ()))
    assert derive_replica_axes(graph, weights_over_dp, ("dp",)) == ()


def test_the_verifier_runs_on_the_per_ipu_program_when_asked(monkeypatch) -> None:
    checked: list[lowering.Graph] = []
    monkeypatch.setattr("partitioner.passes.verify", checked.append)
    graph, mesh, specs = _lowered(), _mesh(), (None, None, P("a", None))
    partitioner.build(graph, mesh, specs, (None,), partitioner.Options(verify=False))
    assert checked == []
    built = partitioner.build(graph, mesh, specs, (None,), VERIFY)
    assert checked == [built.graph]


def test_the_verifier_catches_a_broken_per_ipu_program(monkeypatch) -> None:
    """A partitioner that emitted an op with the wrong result type is stopped before scheduling."""
    real = partitioner.passes.__dict__["partition"]

    def broken(*args, **kwargs):
        out = real(*args, **kwargs)
        op = out.graph.ops[0]
        (result,) = op.results
        wrong = lowering.Value(result.id, (*result.shape, 1), result.dtype)
        bad = lowering.Op(op.name, op.operands, (wrong,), op.attrs, op.regions, op.loc)
        graph = out.graph
        ops = (bad, *graph.ops[1:])
        return type(out)(
            lowering.Graph(graph.inputs, graph.outputs, ops, graph.input_names),
            out.input_shardings,
            out.output_shardings,
            out.global_graph,
            out.propagated,
        )

    monkeypatch.setitem(partitioner.passes.__dict__, "partition", broken)
    options = partitioner.Options(verify=True)
    with pytest.raises(lowering.VerifyError, match="shape rule"):
        partitioner.build(_lowered(), _mesh(), (None, None, P("a")), (None,), options)

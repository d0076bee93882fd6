"""The plan search shares a trace between meshes whose step is alike and whose arguments have
the same shapes (`ipujax.planning.alike`), and only then: a step that captures other values, or
whose program reads the mesh (a sharding constraint), is traced again; a shared trace costs
what a trace of its own costs."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import layered_step, spec
from jax.sharding import AbstractMesh, AxisType
from jax.sharding import PartitionSpec as P

import ipujax
from ipujax.arguments import split_call
from ipujax.planning.alike import MAX_DEPTH, alike_key, reads_a_mesh, shapes_key
from ipujax.planning.traces import Traces, _alike
from lowering import lower


def _scaled(scale: float) -> Any:
    def step(x: Any) -> Any:
        return x * scale

    return step


class _Pair(NamedTuple):
    first: Any
    second: Any


def test_closures_of_one_code_over_equal_values_are_alike() -> None:
    assert alike_key(_scaled(2.0)) == alike_key(_scaled(2.0))
    assert alike_key(_scaled(2.0)) != alike_key(_scaled(3.0))
    assert alike_key(_scaled(0.0)) != alike_key(_scaled(-0.0))
    assert alike_key(_scaled(1)) != alike_key(_scaled(1.0))  # an int and a float trace apart
    pair = lambda a: _Pair(_scaled(a), functools.partial(_scaled, a))  # noqa: E731
    assert alike_key(pair(2.0)) == alike_key(pair(2.0))
    assert alike_key(pair(2.0)) != alike_key(pair(5.0))
    assert alike_key(pair(2.0)) != alike_key((_scaled(2.0), functools.partial(_scaled, 2.0)))


def test_an_array_or_an_object_is_alike_only_to_itself() -> None:
    table = np.arange(4.0)
    assert alike_key(_scaled(table)) == alike_key(_scaled(table))
    assert alike_key(_scaled(table)) != alike_key(_scaled(np.arange(4.0)))
    thing = object()
    assert alike_key(_scaled(thing)) == alike_key(_scaled(thing))
    assert alike_key(_scaled(thing)) != alike_key(_scaled(object()))


def test_a_cycle_or_a_deep_structure_is_not_keyed() -> None:
    loop: list[Any] = []
    loop.append(loop)
    assert alike_key(_scaled(loop)) is None
    deep: Any = 0.0
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    assert alike_key(deep) is None
    assert alike_key([[0.0]] * 3) is not None  # the same list twice, side by side: no cycle


def test_shapes_key_reads_shapes_and_types_not_values() -> None:
    assert shapes_key((np.zeros((2, 3)),)) == shapes_key((spec((2, 3), np.float64),))
    assert shapes_key((spec((2, 3)),)) != shapes_key((spec((3, 2)),))
    assert shapes_key(({"a": spec((2,))},)) != shapes_key(({"b": spec((2,))},))
    mesh = jax.make_mesh((1,), ("dp",))
    placed = jax.ShapeDtypeStruct((2,), np.float32, sharding=jax.NamedSharding(mesh, P("dp")))
    assert shapes_key((placed,)) is None  # its sharding may type the trace


def test_reads_a_mesh() -> None:
    x = spec((8, 4))
    assert not reads_a_mesh(lower(lambda a: jnp.tanh(a) * 2, x))
    mesh = jax.sharding.AbstractMesh((2,), ("tp",))
    with jax.sharding.use_abstract_mesh(mesh):
        constrained = lower(lambda a: jax.lax.with_sharding_constraint(a, P(None, "tp")), x)
    assert reads_a_mesh(constrained)


def _made(dp: int, step: Any, layers: int = 2) -> tuple:
    """A workload made afresh for a mesh of `dp` IPUs, as a factory makes it."""
    mesh = ipujax.make_mesh((dp,), ("dp",))
    params = {
        "embed": spec((8, 16)),
        "layers": [spec((16, 16)) for _ in range(layers)],
        "head": spec((16, 4)),
    }
    kwargs = {"mesh": mesh, "in_shardings": (jax.tree.map(lambda _: P(), params), P("dp"))}
    return step, (params, spec((16, 8))), kwargs


def _costs(lowered: Any) -> tuple:
    report = lowered.compile(check_memory_fits=False).cost_report()
    return report.seconds, report.peak_tile_bytes, report.time_split(), report.fits


def test_meshes_of_alike_steps_share_a_trace_and_cost_as_their_own() -> None:
    traces = Traces()
    made = [_made(dp, layered_step()) for dp in (4, 2, 4)]
    shared = [_costs(traces.lower(*m)) for m in made]
    assert traces.made == 1
    assert shared == [_costs(ipujax.jit(f, **k).lower(*a)) for f, a, k in made]
    assert shared[0] != shared[1]  # the meshes cost apart: only the trace is shared


def test_a_step_unlike_or_of_other_shapes_is_traced_again() -> None:
    traces = Traces()
    traces.lower(*_made(4, layered_step()))
    traces.lower(*_made(4, layered_step(), layers=3))  # another program
    traces.lower(*_made(4, _constrained(0.01)))
    traces.lower(*_made(4, _constrained(0.02)))  # another captured value
    assert traces.made == 4


def _constrained(rate: float) -> Any:
    """An SGD step whose gradients are constrained to be replicated over dp: its program reads
    the mesh it is traced under."""
    step = layered_step()

    def constrained(params: dict[str, Any], x: Any) -> dict[str, Any]:
        new = step(params, x)
        return jax.tree.map(lambda p: jax.lax.with_sharding_constraint(p * rate, P()), new)

    return constrained


@pytest.mark.parametrize("dps", [(4, 2), (4, 4)])
def test_a_step_that_reads_the_mesh_shares_its_trace_only_on_that_mesh(dps: tuple) -> None:
    traces = Traces()
    made = [_made(dp, _constrained(0.01)) for dp in dps]
    shared = [_costs(traces.lower(*m)) for m in made]
    assert traces.made == len(set(dps))
    assert shared == [_costs(ipujax.jit(f, **k).lower(*a)) for f, a, k in made]


def test_no_trace_is_shared_under_explicit_axes() -> None:
    """Under Explicit axes the arguments' shardings type the trace, and shapes say nothing of
    them."""
    call = split_call(_scaled(2.0), (spec((4,)),), {}, (), ())
    auto = AbstractMesh((2,), ("dp",))
    explicit = AbstractMesh((2,), ("dp",), axis_types=(AxisType.Explicit,))
    assert _alike(call, auto, None) is not None
    assert _alike(call, explicit, None) is None

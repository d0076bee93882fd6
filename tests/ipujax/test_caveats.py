"""The report's caveats for what no published figure checks: an op gathered whole on every IPU,
and a system larger than any row of the fidelity table covers."""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import target
from jax.sharding import PartitionSpec as P

import ipujax
from ipujax import fidelity
from ipujax.caveats import SHOWN_WHOLE, VALIDATED_IPUS


def branchy(x):
    # `cond` (StableHLO `case`) has no factor rule of its own yet: it runs whole on every IPU.
    return jax.lax.cond(x.sum() > 0, lambda y: y * 2.0, lambda y: y - 1.0, x)


def _report(fun, mesh, specs, *args) -> ipujax.CostReport:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the warnings are tested where they are made
        return ipujax.jit(fun, mesh=mesh, in_shardings=specs).lower(*args).compile().cost_report()


def test_an_op_gathered_whole_is_a_caveat() -> None:
    mesh = ipujax.make_mesh((2,), ("rows",), target=target(16))
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    report = _report(branchy, mesh, (P("rows"),), x)
    line, ring = report.caveats  # and the gather's ring, which no fidelity row checks
    assert ring.startswith("collectives within a machine (2, first at tests/ipujax/test_caveats")
    assert line.startswith("case at tests/ipujax/test_caveats.py:")
    assert "runs whole on every IPU" in line and "float32[8x4] [{rows}, {}]" in line
    assert line in _report(branchy, mesh, (P("rows"),), x).summary()


def _laplacian(u: jax.Array) -> jax.Array:
    kernel = jnp.array([[0.0, 1, 0], [1, -4, 1], [0, 1, 0]])[None, None]
    return jax.lax.conv_general_dilated(u[None, None], kernel, (1, 1), "SAME")[0, 0]


def test_a_convolution_split_along_its_window_is_said_to_gather() -> None:
    # Rows split over x: the 3x3 window reads neighbours across IPUs, so the rows stay whole,
    # and each IPU gathered the grid and convolved all of it: warned and said, as an op run
    # whole is (it was neither). Its values are jax.jit's.
    mesh = ipujax.make_mesh((4,), ("x",), target=target(16))
    u = np.arange(32 * 16, dtype=np.float32).reshape(32, 16)
    jitted = ipujax.jit(_laplacian, mesh=mesh, in_shardings=P("x"))
    with pytest.warns(ipujax.ReplicationWarning, match="window slides along"):
        compiled = jitted.lower(u).compile()
    (line,) = [c for c in compiled.cost_report().caveats if "runs whole" in c]
    assert line.startswith("convolution at tests/ipujax/test_caveats.py:")
    assert "float32[1x1x32x16] [{}, {}, {x}, {}]" in line
    np.testing.assert_allclose(compiled(u), jax.jit(_laplacian)(u), rtol=1e-6)


def test_nothing_split_nothing_said() -> None:
    mesh = ipujax.make_mesh((2,), ("rows",), target=target(16))
    x = np.ones((8, 4), np.float32)
    assert _report(branchy, mesh, (P(),), x).caveats == ()


def test_many_ops_gathered_whole_are_counted() -> None:
    def many(*xs):
        return [branchy(x) for x in xs]

    mesh = ipujax.make_mesh((2,), ("rows",), target=target(16))
    count = SHOWN_WHOLE + 2
    xs = [np.ones((8, 4), np.float32)] * count
    caveats = _report(many, mesh, (P("rows"),) * count, *xs).caveats
    caveats = [c for c in caveats if "whole on every IPU" in c]
    assert len(caveats) == SHOWN_WHOLE + 1
    assert caveats[-1] == "2 more ops run whole on every IPU"


def test_a_system_across_pod64s_is_a_caveat() -> None:
    def step(w, x):
        return jnp.tanh(x @ w).sum()

    w = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    x = jax.ShapeDtypeStruct((256, 64), jnp.float32)
    for ipus, said in ((64, False), (128, True), (256, True)):
        mesh = ipujax.make_mesh((ipus,), ("dp",), target=ipujax.Target.bow().with_tiles(16))
        caveats = _report(step, mesh, (P(), P("dp")), w, x).caveats
        across = [c for c in caveats if f"a system of {ipus:,} IPUs over" in c]
        assert bool(across) == said
        assert not [c for c in caveats if "no published figure checks" in c]  # a Pod256 row


def test_the_validated_size_is_the_tables() -> None:
    assert max(f.ipus for f in fidelity.FIGURES) == VALIDATED_IPUS


def _kept_caveats(fun: Any, *args: Any) -> list[str]:
    report = ipujax.jit(fun).lower(*args).compile().cost_report()
    return [c for c in report.caveats if "returned updated" in c]


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")
def test_an_argument_returned_updated_is_said_to_be_kept_on_the_ipus() -> None:
    # The host figures take an argument the step returns with the same structure and types as
    # state kept between calls, charged nothing: said, as a plain function is read so too.
    x = jax.ShapeDtypeStruct((256, 256), jnp.float32)
    assert _kept_caveats(lambda x: (2 * x, x.max()), x) == [
        "x returned updated: taken as kept on the IPUs, no host transfer"
    ]
    params = {"w": x, "b": jax.ShapeDtypeStruct((256,), jnp.float32)}
    step = lambda params, x: (jax.tree.map(lambda p: p * 0.5, params), (x @ params["w"]).sum())  # noqa: E731
    assert _kept_caveats(step, params, x) == [
        "params returned updated: taken as kept on the IPUs, no host transfer"
    ]
    assert _kept_caveats(lambda x: x.sum(1), x) == []
    # An argument with no leaves (an optimizer's empty state) is returned "updated" too: it has
    # nothing to send, and is not named (it raised an IndexError).
    stateless = lambda params, state: (jax.tree.map(lambda p: p * 0.5, params), state)  # noqa: E731
    assert _kept_caveats(stateless, params, ()) == [
        "params returned updated: taken as kept on the IPUs, no host transfer"
    ]

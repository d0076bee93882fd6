"""Host callbacks on one IPU: `jax.debug.print` prints at run time what `jax.jit` prints, in
order; `pure_callback` and `io_callback` return `jax.jit`'s values; each costs a round trip to
the host (hand-derived); an ordered callback is refused at the user's line."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

import ipujax
import lowering

X = np.arange(12, dtype=np.float32).reshape(3, 4) / 7


def two_prints(x):
    jax.debug.print("sum {s:.4f} first row {r}", s=x.sum(), r=x[0])
    y = jnp.tanh(x) * 2
    jax.debug.print("then {}", y[1, 2])
    return y


def test_debug_print_prints_jits_text_in_order_when_the_program_runs(capfd) -> None:
    compiled = ipujax.jit(two_prints).lower(X).compile()
    assert capfd.readouterr().out == ""  # costing a program never runs it
    got = compiled(X)
    ours = capfd.readouterr().out
    expected = jax.jit(two_prints)(X)
    theirs = capfd.readouterr().out
    assert ours == theirs
    assert ours.index("sum ") < ours.index("then ")
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_each_call_prints_again(capfd) -> None:
    jitted = ipujax.jit(two_prints)
    jitted(X)
    jitted(X + 1)
    out = capfd.readouterr().out
    assert out.count("sum ") == 2 and out.count("then ") == 2


def test_a_print_nothing_reads_is_kept_and_costs_a_round_trip_by_hand() -> None:
    """`sum` (an f32 scalar, 4 B) and `x[0]` (4 f32, 16 B) go to the host: 20 B out, nothing
    back but jax's acknowledgement. On a Bow IPU (1.85 GHz, 7 GB/s, 50,000 cycles latency per
    transfer): 2 x 50,000 + ceil(20 x 1.85e9 / 7e9) = 100,000 + ceil(5.29) = 100,006 cycles.
    The second print sends `y[1, 2]`, 4 B: 100,000 + ceil(1.06) = 100,002."""
    report = ipujax.jit(two_prints).lower(X).compile().cost_report()
    steps = [s for s in report.supersteps if s.op == "host_callback"]
    assert [s.link_cycles for s in steps] == [100_006, 100_002]
    assert [s.exchange_bytes for s in steps] == [20, 4]
    assert all(s.kind == "host" and s.cycles == s.link_cycles for s in steps)
    assert all("test_debug_print.py" in s.source for s in steps)


def test_the_graph_keeps_the_callback() -> None:
    graph = lowering.eliminate_dead_code(lowering.lower(two_prints, X))
    assert sum(op.name == "host_callback" for op in graph.ops) == 2


def test_pure_and_io_callbacks_return_jits_values() -> None:
    def host_double(v):
        return np.asarray(v) * 2

    def f(x):
        shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
        a = jax.pure_callback(host_double, shape, x)
        b = io_callback(host_double, shape, x + 1)
        return a + b

    np.testing.assert_array_equal(np.asarray(ipujax.jit(f)(X)), np.asarray(jax.jit(f)(X)))
    report = ipujax.jit(f).lower(X).compile().cost_report()
    # 48 B out and 48 B back: 100,000 + ceil(96 x 1.85e9 / 7e9) = 100,000 + ceil(25.37) = 100,026
    steps = [s for s in report.supersteps if s.op == "host_callback"]
    assert [s.link_cycles for s in steps] == [100_026, 100_026]


def test_an_ordered_print_is_refused_at_its_line_with_the_fix() -> None:
    def ordered(x):
        jax.debug.print("x {}", x, ordered=True)
        return x

    with pytest.raises(lowering.UnsupportedOpError) as error:
        ipujax.jit(ordered).lower(X)
    message = str(error.value)
    assert "test_debug_print.py" in message and "ordered=False" in message

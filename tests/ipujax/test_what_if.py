"""What if the machine were different (`Compiled.what_if`, `sensitivity`, `ipujax what-if`):
the same program rebuilt on a changed Target, checked by hand on a data-parallel gradient's
AllReduce, and the CLI's table and errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import ipujax
from ipujax.cli import main
from ipujax.what_if import PARAMETERS, changed_target
from partitioner import ConfigError

WORKLOADS = "tests/cli/workloads.py"


def _sgd_step(w, x):
    loss, grad = jax.value_and_grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
    return w - 0.01 * grad, loss  # the weight stays on the device from step to step


@pytest.fixture(scope="module")
def compiled() -> ipujax.Compiled:
    """An SGD step of a 16 MiB f32 weight over dp=16 on a Bow Pod16: its gradient's AllReduce."""
    mesh = ipujax.make_mesh((16,), ("dp",), target=ipujax.Target.bow())
    w = jax.ShapeDtypeStruct((4096, 1024), jnp.float32)
    x = jax.ShapeDtypeStruct((16 * 8, 4096), jnp.float32)
    jitted = ipujax.jit(_sgd_step, mesh=mesh, in_shardings=(P(), P("dp")))
    return jitted.lower(w, x).compile()


def test_doubling_the_links_nearly_halves_the_all_reduce(compiled) -> None:
    before = compiled.cost_report()
    after = compiled.what_if(ipu_link_bytes_per_second="2x", gateway_link_bytes_per_second="2x")
    now, then = before.time_split(), after.time_split()
    # A ring moves 2 (n - 1) / n of the buffer over links twice as fast; its per-step
    # latencies and syncs stay: the collectives' time falls by a little under 2.
    assert 1.6 <= now["collectives"] / then["collectives"] <= 2.4
    assert then["compute"] == now["compute"] and then["exchange"] == now["exchange"]
    sent = [[c.bytes_per_ipu for c in r.collectives] for r in (before, after)]
    assert sent[0] == sent[1] and max(sent[0]) > 16 * 2**20  # the same bytes, faster links


def test_the_clock_changes_cycles_not_seconds_of_the_links(compiled) -> None:
    before, after = compiled.cost_report(), compiled.what_if(clock_hz="2x")
    # Compute is counted in cycles: twice the clock, half the seconds.
    assert after.time_split()["compute"] == pytest.approx(before.time_split()["compute"] / 2)
    assert after.clock_hz == 2 * before.clock_hz


def test_sensitivity_names_every_parameter(compiled) -> None:
    elasticity = compiled.sensitivity()
    assert set(elasticity) == set(PARAMETERS)
    assert elasticity["memory"] == 0 and elasticity["streaming"] == 0  # unphased, it fits
    assert -1 <= elasticity["links"] < -0.1  # its AllReduce is a large part of the step
    assert all(-1.01 <= e <= 0.01 for e in elasticity.values())


def test_changed_target_by_value_and_factor() -> None:
    bow = ipujax.Target.bow()
    changed = changed_target(bow, {"sync_cycles": "1.5x", "host_bytes_per_second": 14e9})
    assert changed.sync_cycles == 135 and changed.host_bytes_per_second == 14e9
    assert changed_target(bow, {"exchange_bytes_per_cycle": "0.1x"}).exchange_bytes_per_cycle == 1


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"link_speed": "2x"}, "Target has no field"),
        ({"name": "2x"}, "is not a number"),
        ({"clock_hz": "fast"}, "give a number"),
        ({"clock_hz": "-1"}, "must be positive"),
        ({"clock_hz": "nan"}, "positive and finite"),
        ({"sync_cycles": "inf"}, "positive and finite"),
        ({"clock_hz": "1e400"}, "positive and finite"),
        ({"exchange_bytes_per_cycle": "infx"}, "positive and finite"),
    ],
)
def test_bad_changes_are_config_errors(changes, message) -> None:
    with pytest.raises(ConfigError, match=message):
        changed_target(ipujax.Target.bow(), changes)


def test_the_command_prints_before_and_after(capsys) -> None:
    code = main(
        [
            "what-if",
            f"{WORKLOADS}:mlp_data_parallel",
            "--mesh",
            "dp=4",
            "--set",
            "ipu_link_bytes_per_second=2x",
            "--sensitivity",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "What if ipu_link_bytes_per_second=2x" in out and "collectives" in out
    assert "Sensitivity" in out and "host_bytes_per_second" in out


@pytest.mark.parametrize(
    "flags, message",
    [
        ([], "needs --set"),
        (["--set", "clock_hz"], "expected NAME=VALUE"),
        (["--set", "warp=2x"], "Target has no field"),
    ],
)
def test_the_command_refuses_bad_flags_in_one_line(flags, message, capsys) -> None:
    assert main(["what-if", f"{WORKLOADS}:mlp", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ipujax: error:") and message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "before, after, said", [(2.0, 1.0, "2.00x faster"), (1.0, 1.25, "1.25x slower"), (1.0, 0, "-")]
)
def test_the_table_says_slower_for_a_slowdown(before: float, after: float, said: str) -> None:
    from ipujax.views.what_if import _ratio

    assert _ratio(before, after) == said

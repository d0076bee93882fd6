"""Latency and rate per call (`ipujax/latency.py`, `CostReport.latency`): a call's host transfer
in, device time and transfer out, and calls per second, with device iterations (several calls'
inputs per host transfer, as Poplar's `deviceIterations`): each transfer's fixed latency paid
once per round, its bytes and the device's work once per call (docs/target.md, "Latency per call
and device iterations")."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import spec
from hypothesis import given, settings
from hypothesis import strategies as st

import ipujax
from ipujax.__main__ import main
from ipujax.latency import HOST_INPUTS, HOST_OUTPUTS, split_latency
from partitioner import ConfigError, Superstep

# Bow (docs/target.md): 1.85 GHz; each host transfer 50,000 cycles, then its bytes at 7e9 B/s.
LATENCY, CLOCK = 50_000, 1.85e9


def _step(name: str, link: int = 0, compute: int = 0, kind: str = "host") -> Superstep:
    return Superstep(name, "op", "", 0, 0, 0, compute, 0, 0, link_cycles=link, kind=kind)


def _steps(host_in: int, device: int, host_out: int) -> list[Superstep]:
    return [
        _step(HOST_INPUTS, link=host_in),
        _step("work", compute=device, kind="compute"),
        _step(HOST_OUTPUTS, link=host_out),
    ]


def test_split_by_hand_with_eight_iterations() -> None:
    # Inputs 60,000 exposed cycles = 50,000 latency + 10,000 of bytes; outputs 50,400 = 50,000 +
    # 400; the device 1,000,000 cycles at 2 GHz. Eight calls a round: the inputs' transfer is
    # 50,000 + 8 x 10,000 = 130,000 cycles, the outputs' 50,000 + 8 x 400 = 53,200, the device
    # 8,000,000: a round of 8,183,200 cycles = 4.0916 ms, which every call of it waits for;
    # 8 / 4.0916 ms = 1,955.2 calls/s. Per call: host in 130,000 / 8 = 16,250 cycles = 8.125 us,
    # device 0.5 ms, host out 53,200 / 8 = 6,650 cycles = 3.325 us.
    call = split_latency(_steps(60_000, 1_000_000, 50_400), 1_110_400, 2e9, 50_000, 8)
    assert call.iterations == 8
    assert call.host_in_seconds == pytest.approx(8.125e-6)
    assert call.device_seconds == pytest.approx(0.5e-3)
    assert call.host_out_seconds == pytest.approx(3.325e-6)
    assert call.latency_seconds == pytest.approx(4.0916e-3)
    assert call.calls_per_second == pytest.approx(8 / 4.0916e-3)
    assert call.seconds_per_call == pytest.approx(8.125e-6 + 0.5e-3 + 3.325e-6)


def test_one_iteration_is_the_step() -> None:
    # N = 1: the call is the step, 60,000 + 1,000,000 + 50,400 = 1,110,400 cycles at 2 GHz =
    # 0.5552 ms; 1,801.2 calls/s.
    call = split_latency(_steps(60_000, 1_000_000, 50_400), 1_110_400, 2e9, 50_000, 1)
    assert call.latency_seconds == pytest.approx(0.5552e-3)
    assert call.seconds_per_call == pytest.approx(0.5552e-3)
    assert call.calls_per_second == pytest.approx(1 / 0.5552e-3)


def test_a_transfer_compute_hid_pays_no_more_latency() -> None:
    # Compute hid all but 20,000 cycles of the inputs' transfer, less than its latency: the
    # round pays those 20,000 once however many calls it carries, 20,000 / 4 = 5,000 a call.
    call = split_latency(_steps(20_000, 100_000, 0), 120_000, 1e9, 50_000, 4)
    assert call.host_in_seconds == pytest.approx(5_000 / 1e9)
    assert call.host_out_seconds == 0
    assert call.latency_seconds == pytest.approx((20_000 + 4 * 100_000) / 1e9)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 10**6),
    st.integers(1, 10**7),
    st.integers(0, 10**6),
    st.integers(1, 64),
)
def test_more_iterations_raise_rate_and_latency(host_in: int, device: int, host_out: int, n: int):
    steps = _steps(host_in, device, host_out)
    total = host_in + device + host_out
    one, many = (split_latency(steps, total, CLOCK, LATENCY, k) for k in (n, n + 1))
    assert many.calls_per_second >= one.calls_per_second * (1 - 1e-12)
    assert many.latency_seconds >= one.latency_seconds
    assert many.seconds_per_call <= one.seconds_per_call * (1 + 1e-12)
    # The round is its calls: N calls' amortised seconds add up to it.
    assert one.seconds_per_call * n == pytest.approx(one.latency_seconds)


# ---- through ipujax.jit -------------------------------------------------------------------------


def double(x):
    return x * 2


def test_report_latency_by_hand_on_one_bow() -> None:
    # x and the result are f32[1750]: 7,000 B each way, ceil(7,000 x 1.85e9 / 7e9) = 1,850
    # cycles after the 50,000 of latency. Four calls a round: each transfer 50,000 + 4 x 1,850
    # = 57,400 cycles, 14,350 a call = 7.757 us; the round 2 x 57,400 + 4 D cycles, D the
    # device's cycles of one call.
    compiled = ipujax.jit(double, device_iterations=4).lower(spec((1750,))).compile()
    report = compiled.cost_report()
    first, *_, last = report.supersteps
    assert first.link_cycles == last.link_cycles == LATENCY + 1_850
    device = report.total_cycles - 2 * (LATENCY + 1_850)
    call = report.latency
    assert call.iterations == report.device_iterations == 4
    assert report.host_latency_cycles == LATENCY
    assert call.host_in_seconds == call.host_out_seconds == pytest.approx(14_350 / CLOCK)
    assert call.device_seconds == pytest.approx(device / CLOCK)
    assert call.latency_seconds == pytest.approx((2 * 57_400 + 4 * device) / CLOCK)
    assert call.calls_per_second == pytest.approx(4 * CLOCK / (2 * 57_400 + 4 * device))
    assert "4 device iterations" in report.summary()
    x = jnp.arange(1750, dtype=jnp.float32)
    np.testing.assert_array_equal(compiled(x), jax.jit(double)(x))  # values unchanged


def test_without_iterations_the_call_is_the_step() -> None:
    report = ipujax.jit(double).lower(spec((1750,))).compile().cost_report()
    assert report.device_iterations == 1
    assert report.latency.latency_seconds == pytest.approx(report.seconds)
    assert report.latency.calls_per_second == pytest.approx(1 / report.seconds)


def test_json_round_trip_keeps_the_iterations() -> None:
    report = ipujax.jit(double, device_iterations=16).lower(spec((1750,))).compile().cost_report()
    data = json.loads(report.to_json())
    assert data["device_iterations"] == 16
    assert data["latency"]["calls_per_second"] == pytest.approx(report.latency.calls_per_second)
    again = ipujax.CostReport.from_json(report.to_json())
    assert again == report
    assert again.latency == report.latency


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8"])
def test_bad_iterations_are_config_errors(bad: object) -> None:
    with pytest.raises(ConfigError, match="device_iterations"):
        ipujax.jit(double, device_iterations=bad)


_WORKLOAD = """
import jax
import jax.numpy as jnp


def work():
    return (lambda x: x * 2), (jax.ShapeDtypeStruct((1750,), jnp.float32),)
"""


def test_cli_device_iterations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (workload := tmp_path / "double.py").write_text(_WORKLOAD)
    out = tmp_path / "report.json"
    argv = ["cost-report", f"{workload}:work", "--device-iterations", "8", "--json", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    assert data["latency"]["iterations"] == 8
    # Each transfer 50,000 + 8 x 1,850 = 64,800 cycles for eight calls.
    assert data["latency"]["host_in_seconds"] == pytest.approx(64_800 / 8 / CLOCK)


def test_cli_bad_device_iterations_is_a_user_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workload := tmp_path / "double.py").write_text(_WORKLOAD)
    assert main(["cost-report", f"{workload}:work", "--device-iterations", "0"]) == 2
    assert "device_iterations=0" in capsys.readouterr().err

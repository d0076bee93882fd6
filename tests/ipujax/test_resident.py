"""Resident arguments: `ipujax.jit(resident_argnums=..., resident_argnames=...)` marks arguments
that live on the IPUs between calls (weights, a KV cache); they are loaded once and never charged
per call over the host link (docs/target.md, "Streaming memory, host and phases"). Without it,
an inference step that is mostly host transfers warns once, naming what it sends."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_trees_close, device_cycles, mesh, spec, target
from jax.sharding import PartitionSpec as P

import ipujax
from ipujax.__main__ import main

F16 = np.float16
# Bow's host transfers (docs/target.md): 50,000 cycles of latency, then bytes at 7e9 B/s, 1.85 GHz.
LATENCY, CLOCK, RATE = 50_000, 1.85e9, 7e9


def mlp(params, x):
    return jax.nn.relu(x @ params["w1"]) @ params["w2"]


def _params(shape: tuple[int, int], dtype=F16) -> dict:
    return {"w1": spec(shape, dtype), "w2": spec(shape[::-1], dtype)}


def _report(fun, *args, **jit_kwargs) -> ipujax.CostReport:
    return ipujax.jit(fun, **jit_kwargs).lower(*args).compile().cost_report()


def _host_steps(report: ipujax.CostReport) -> tuple[int, int]:
    first, *_, last = report.supersteps
    assert (first.kind, last.kind) == ("host", "host")
    return first.exchange_bytes, last.exchange_bytes


# ---- the 16 MiB fp16 MLP on one Bow -------------------------------------------------------------


def test_resident_weights_send_only_the_input_and_the_output() -> None:
    # x and the result are f16[8, 2048]: 8 x 2048 x 2 = 32,768 B each way; the weights,
    # 2 x 2048 x 2048 x 2 = 16,777,216 B, are not sent. Each transfer: 50,000 cycles, then
    # ceil(32,768 x 1.85e9 / 7e9) = ceil(8,660.1) = 8,661.
    report = _report(mlp, _params((2048, 2048)), spec((8, 2048), F16), resident_argnums=(0,))
    assert _host_steps(report) == (32_768, 32_768)
    assert report.host_bytes == 65_536
    first, *_, last = report.supersteps
    assert first.link_cycles == last.link_cycles == LATENCY + 8_661
    assert report.total_cycles == device_cycles(report) + 2 * 58_661


def test_resident_costs_what_closed_over_weights_cost() -> None:
    weights = {k: jnp.zeros(v.shape, F16) for k, v in _params((2048, 2048)).items()}
    x = spec((8, 2048), F16)
    resident = _report(mlp, _params((2048, 2048)), x, resident_argnums=0)
    closed = _report(lambda x: mlp(weights, x), x)
    assert resident.host_bytes == closed.host_bytes == 65_536
    assert resident.seconds <= 1.2 * closed.seconds
    with pytest.warns(ipujax.HostBoundWarning):
        sent = _report(mlp, _params((2048, 2048)), x)
    # Sent, the input transfer carries the weights too, 16,777,216 + 32,768 = 16,809,984 B:
    # ceil(16,809,984 x 1.85e9 / 7e9) = ceil(4,442,638.6) = 4,442,639 cycles against 8,661;
    # the device's cycles are the same.
    assert sent.host_bytes == 16_777_216 + 65_536
    assert device_cycles(sent) == device_cycles(resident)
    assert sent.total_cycles - resident.total_cycles == 4_442_639 - 8_661


def test_resident_leaves_memory_alone() -> None:
    args = (_params((256, 256), np.float32), spec((8, 256)))
    with pytest.warns(ipujax.HostBoundWarning):
        sent = ipujax.jit(mlp, mesh=mesh()).lower(*args).compile()
    resident = ipujax.jit(mlp, mesh=mesh(), resident_argnums=0).lower(*args).compile()
    assert (resident.memory.total == sent.memory.total).all()
    assert device_cycles(resident.cost_report()) == device_cycles(sent.cost_report())


# ---- values, names and keywords -----------------------------------------------------------------


def _weights(n: int = 64) -> dict:
    rng = np.random.default_rng(0)
    return {
        "w1": rng.standard_normal((n, n)).astype(np.float32) / 8,
        "w2": rng.standard_normal((n, n)).astype(np.float32) / 8,
    }


def test_resident_values_are_jax_jits() -> None:
    params, x = _weights(), np.ones((4, 64), np.float32)
    step = ipujax.jit(mlp, mesh=mesh(), resident_argnums=(0,))
    assert_trees_close(step(params, x), jax.jit(mlp)(params, x), rtol=1e-5, atol=1e-5)
    assert_trees_close(step(params, 2 * x), jax.jit(mlp)(params, 2 * x), rtol=1e-5, atol=1e-5)


def test_resident_argnames_by_position_and_by_keyword() -> None:
    params, x = _params((256, 256), np.float32), spec((8, 256))
    # 8 x 256 x 4 = 8,192 B each way.
    by_name = _report(mlp, params, x, mesh=mesh(), resident_argnames="params")
    assert _host_steps(by_name) == (8_192, 8_192)
    jitted = ipujax.jit(mlp, mesh=mesh(), resident_argnames=("params",))
    keyword = jitted.lower(params=params, x=x).compile().cost_report()
    assert _host_steps(keyword) == (8_192, 8_192)
    by_number = ipujax.jit(mlp, mesh=mesh(), resident_argnums=0).lower(params=params, x=x)
    assert _host_steps(by_number.compile().cost_report()) == (8_192, 8_192)


def test_resident_with_static_arguments_before_it() -> None:
    def scaled(scale, params, x):
        return scale * mlp(params, x)

    params, x = _params((256, 256), np.float32), spec((8, 256))
    jitted = ipujax.jit(scaled, mesh=mesh(), static_argnums=0, resident_argnums=1)
    assert _host_steps(jitted.lower(2.0, params, x).compile().cost_report()) == (8_192, 8_192)


# ---- the warning --------------------------------------------------------------------------------


def test_a_host_bound_step_warns_once_naming_the_argument() -> None:
    step = ipujax.jit(mlp, mesh=mesh())
    params, x = _weights(256), np.ones((8, 256), np.float32)
    with pytest.warns(ipujax.HostBoundWarning) as caught:
        step(params, x)
        step(params, 2 * x)  # cached: compiled once, warned once
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "params (524,288 B)" in message and "resident_argnames=('params',)" in message
    assert "resident_argnums" in message and "x (" not in message  # x is 8 KiB
    assert caught[0].filename == __file__


def _heavy(x):
    for _ in range(8):
        x = jnp.tanh(x @ x)
    return x.sum()


def test_no_warning_when_resident_or_small_or_compute_bound() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _report(mlp, _params((256, 256), np.float32), spec((8, 256)), resident_argnums=0)
        _report(mlp, _params((64, 64), np.float32), spec((8, 64)), mesh=mesh())  # 32 KiB
        # 64 KiB sent, but eight 128 x 128 matmuls on 16 tiles take most of the step.
        _report(_heavy, spec((128, 128)), mesh=mesh())


# ---- bad settings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"resident_argnums": 2}, r"resident_argnums=\(2,\): 2 is out of range: .*mlp .*takes 2"),
        ({"resident_argnums": -3}, r"-3 is out of range"),
        ({"resident_argnums": "0"}, r"resident_argnums='0': '0' is not a position"),
        ({"resident_argnums": True}, r"True is not a position"),
        ({"resident_argnames": "parms"}, r"'parms' is not a parameter of mlp .*params, x"),
        ({"resident_argnames": 0}, r"resident_argnames=0: 0 is not a name"),
        ({"resident_argnums": 0, "static_argnums": 0}, r"params is both static and resident"),
        ({"resident_argnames": "x", "static_argnums": 1}, r"x is both static and resident"),
    ],
)
def test_bad_resident_arguments_are_config_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ipujax.ConfigError, match=match):
        ipujax.jit(mlp, **kwargs)
    with pytest.raises(ipujax.ConfigError, match=match):
        ipujax.jit(**kwargs)(mlp)  # as a decorator


def test_a_position_past_a_varargs_call_is_a_config_error() -> None:
    def total(*xs):
        return sum(xs)

    jitted = ipujax.jit(total, mesh=mesh(), resident_argnums=3)
    with pytest.raises(ipujax.ConfigError, match=r"3 is out of range: this call of .*passes 2"):
        jitted.lower(spec((4,)), spec((4,)))
    resident = jitted.lower(*[spec((4,))] * 4).compile().cost_report()
    assert _host_steps(resident) == (3 * 16, 16)


# ---- data parallel ------------------------------------------------------------------------------


def test_replicated_weights_resident_on_four_replicas() -> None:
    # dp=4: each IPU holds the whole weights (replicated) and a quarter of x, f32[8, 256] ->
    # f32[2, 256], 2,048 B each way per IPU; the system's host bytes: 4 x 2 x 2,048 = 16,384.
    # Sent, each IPU also receives the weights, 2 x 256 x 256 x 4 = 524,288 B.
    dp = ipujax.make_mesh((4,), ("dp",), target=target(16))
    shardings = (None, P("dp"))
    params, x = _params((256, 256), np.float32), spec((8, 256))
    kw = {"mesh": dp, "in_shardings": shardings, "out_shardings": P("dp")}
    resident = _report(mlp, params, x, resident_argnums=0, **kw)
    assert _host_steps(resident) == (2_048, 2_048)
    assert resident.host_bytes == 16_384
    with pytest.warns(ipujax.HostBoundWarning, match="params"):
        sent = _report(mlp, params, x, **kw)
    assert sent.host_bytes == 16_384 + 4 * 524_288
    weights, xs = _weights(256), np.ones((8, 256), np.float32)
    step = ipujax.jit(mlp, resident_argnums=0, **kw)
    assert_trees_close(step(weights, xs), jax.jit(mlp)(weights, xs), rtol=1e-5, atol=1e-5)


# ---- the CLI ------------------------------------------------------------------------------------

_WORKLOAD = """
import jax
import jax.numpy as jnp


def mlp(params, x):
    return jax.nn.relu(x @ params["w1"]) @ params["w2"]


def work():
    w = jax.ShapeDtypeStruct((256, 256), jnp.float32)
    return mlp, ({"w1": w, "w2": w}, jax.ShapeDtypeStruct((8, 256), jnp.float32))
"""


@pytest.mark.parametrize("flag", ["0", "params"])
def test_cli_resident_flag(flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (workload := tmp_path / "mlp.py").write_text(_WORKLOAD)
    out = tmp_path / "report.json"
    code = main(["cost-report", f"{workload}:work", "--resident", flag, "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["host_bytes"] == 2 * 8 * 256 * 4


def test_cli_without_the_flag_warns_and_sends_the_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workload := tmp_path / "mlp.py").write_text(_WORKLOAD)
    out = tmp_path / "report.json"
    with pytest.warns(ipujax.HostBoundWarning, match="params"):
        assert main(["cost-report", f"{workload}:work", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["host_bytes"] == 2 * 256 * 256 * 4 + 2 * 8 * 256 * 4


@pytest.mark.parametrize("flag", ["", "0,", "w-1", "1.5"])
def test_cli_bad_resident_flag_is_a_user_error(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workload := tmp_path / "mlp.py").write_text(_WORKLOAD)
    assert main(["cost-report", f"{workload}:work", "--resident", flag]) == 2
    assert "--resident" in capsys.readouterr().err


def test_cli_resident_name_that_is_not_a_parameter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workload := tmp_path / "mlp.py").write_text(_WORKLOAD)
    assert main(["cost-report", f"{workload}:work", "--resident", "weights"]) == 2
    assert "'weights' is not a parameter of mlp" in capsys.readouterr().err

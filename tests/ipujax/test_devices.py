"""The distributed engine: with two host devices, a mesh of virtual IPUs runs spread over both.

XLA reads `--xla_force_host_platform_device_count` once, when jax starts, and this process has
one device; so `two_devices_child.py` runs in a child process that sees two, and prints what it
found as one JSON line. Its cases: an MLP's loss and gradients on dp=2 x tp=2 (weights split
over tp, the batch over dp) and on dp=4 (two IPUs per device), a small CNN's weight gradients
on dp=4 (convolutions grouped over the IPUs, see lowering/conv_dots.py), and two SGD steps with
donation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import two_devices_child as child
from helpers import run_python
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import ipujax
from ipujax.runtime.devices import DevicePlan, _best_first, _factors
from partitioner.sharding.specs import Sharding

CHILD = Path(__file__).with_name("two_devices_child.py")


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    run = run_python(str(CHILD), XLA_FLAGS="--xla_force_host_platform_device_count=2")
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["dp_tp", "dp"])
def test_both_devices_run_the_program(report: dict[str, Any], case: str) -> None:
    found = report[case]
    assert report["visible_devices"] == 2
    assert found["devices"] == [0, 1]  # Compiled.devices: two distinct devices
    assert found["single_devices"] == [0]
    assert found["output_devices"] == [0, 1]
    # One XLA program partitioned over both devices, each doing about half of the FLOPs that
    # the one device does (a little more: the joins of the outputs are not split).
    assert found["spread"]["partitions"] == 2
    assert found["single"]["partitions"] == 1
    assert found["spread"]["flops"] < 0.6 * found["single"]["flops"]


@pytest.mark.parametrize("case", ["dp_tp", "dp", "cnn"])
def test_numbers_are_unchanged(report: dict[str, Any], case: str) -> None:
    # Sums across devices may associate differently from sums on one (dp=4 on two devices adds
    # (a + b) + (c + d)), so the values agree to rounding; where no sum crosses devices in
    # another order they are usually bit-identical.
    found = report[case]
    assert found["max_diff_vs_one_device"] <= 1e-6
    assert found["max_diff_vs_jax_jit"] <= 1e-6


def test_a_training_loop_keeps_its_state_in_place(report: dict[str, Any]) -> None:
    loop = report["loop"]
    assert loop["outputs_where_inputs_go"]
    assert loop["xla_compiles"] == 1  # the second step did not compile again
    assert loop["donated_consumed"]
    assert loop["max_diff_vs_jax_jit"] <= 1e-6


def test_one_device_runs_the_plain_vmaps() -> None:
    """With one device (named here; by default the only one this process sees) the runner is
    the jitted vmaps alone, on jax's default device, as before devices were spread over."""
    mesh = ipujax.make_mesh((2, 2), ("dp", "tp"), target=ipujax.Target.bow().with_tiles(16))
    jitted = ipujax.jit(lambda x: x * 2, mesh=mesh, devices=jax.devices()[:1])
    compiled = jitted.lower(jax.numpy.ones(4)).compile()
    assert compiled.devices == (jax.devices()[0],)
    assert compiled.run.shardings is None and compiled.run.device is None
    if jax.device_count() == 1:
        default = ipujax.jit(lambda x: x * 2, mesh=mesh).lower(jax.numpy.ones(4)).compile()
        assert default.devices == (jax.devices()[0],)
        assert default.run.shardings is None
    one_ipu = ipujax.jit(lambda x: x * 2, devices=jax.devices()[:1]).lower(jax.numpy.ones(4))
    assert one_ipu.compile().devices == (jax.devices()[0],)


def test_empty_devices_is_a_config_error() -> None:
    with pytest.raises(ipujax.ConfigError, match="devices"):
        ipujax.jit(lambda x: x * 2, devices=[]).lower(jax.numpy.ones(4)).compile()


# ---- the device plan, without devices to spread over -------------------------------------------


def test_each_axis_takes_the_devices_that_divide_it() -> None:
    sizes = {"dp": 2, "tp": 2}
    assert _factors(sizes, ["tp", "dp"], 2) == {"tp": 2}
    assert _factors(sizes, ["dp", "tp"], 2) == {"dp": 2}  # the better axis first
    assert _factors(sizes, ["tp", "dp"], 3) == {"tp": 2}  # one device left over
    assert _factors(sizes, ["tp", "dp"], 4) == {"tp": 2, "dp": 2}
    assert _factors({"dp": 6}, ["dp"], 4) == {"dp": 3}
    assert _factors({"dp": 3, "tp": 2}, ["dp", "tp"], 4) == {"dp": 3}
    assert _factors({"dp": 6, "tp": 4}, ["dp", "tp"], 8) == {"dp": 2, "tp": 4}  # all 8
    assert _factors({"dp": 3}, ["dp"], 2) == {}


def test_axes_splitting_weights_come_first() -> None:
    mesh = ipujax.make_mesh((2, 2), ("dp", "tp"), target=ipujax.Target.bow().with_tiles(16))
    params, x, y = child.example()
    specs = ({"w1": P(None, "tp"), "b1": P("tp"), "w2": P("tp", None)}, P("dp"), P("dp"))
    jitted = ipujax.jit(jax.grad(child.mlp_loss), mesh=mesh, in_shardings=specs)
    compiled = jitted.lower(params, x, y).compile()
    assert compiled.partitioned is not None
    assert _best_first(compiled.partitioned, mesh.axis_names) == ["tp", "dp"]


def test_whole_arrays_are_split_where_the_ipus_split_them_evenly() -> None:
    grid = np.array(jax.devices()[:1], dtype=object).reshape(1, 1)
    plan = DevicePlan(Mesh(grid, ("devices_dp", "devices_tp")), {"dp": "devices_dp"})
    sizes = {"dp": 2, "tp": 2}
    split = Sharding((("dp",), ("tp",)))
    assert plan.global_sharding(split, (8, 4), sizes).spec == P("devices_dp", None)
    assert plan.global_sharding(split, (7, 4), sizes).spec == P(None, None)  # padded: whole
    minor = Sharding((("tp", "dp"),))  # dp is not the major axis: its devices' rows interleave
    assert plan.global_sharding(minor, (8,), sizes).spec == P(None)

"""Multi-host: a mesh of virtual IPUs spread over the devices of two processes joined by
`jax.distributed`, on this machine (issue 20).

`jax.distributed.initialize` can run once per process and before jax starts a backend, which
pytest's process has long done; so `two_processes_child.launch` starts two processes with one
CPU device each and a coordinator on a free port of 127.0.0.1. Each compiles an MLP's SGD step
on dp=2 x tp=2 (weights split over tp, the batch over dp), which the device plan spreads over
tp, one device of each process, so tp's all-reduces cross the processes (over gloo). Each
process reports, as one JSON line, what it ran on and its values against its own alone.
"""

from __future__ import annotations

from typing import Any

import pytest
import two_processes_child as child

# Both processes take about 5 s on this 2-core machine; the deadline is for a hang (a process
# waiting for a dead peer), after which both are killed and their output shown.
DEADLINE_SECONDS = 120


@pytest.fixture(scope="module")
def reports() -> list[dict[str, Any]]:
    finished = child.launch(devices_per_process=1, timeout=DEADLINE_SECONDS)
    failed = [f for f in finished if f.returncode != 0]
    if failed:
        pytest.fail(
            "two processes joined by jax.distributed (CPU devices, gloo collectives, coordinator "
            "on 127.0.0.1) did not both finish:\n" + "\n".join(f.describe() for f in finished),
            pytrace=False,
        )
    return [f.report() for f in finished]


def test_the_processes_join(reports: list[dict[str, Any]]) -> None:
    assert [r["process_index"] for r in reports] == [0, 1]
    assert all(r["process_count"] == 2 for r in reports)
    # Every process sees every device, in the same order; each has one of its own.
    assert reports[0]["devices"] == reports[1]["devices"]
    assert sorted(p for _, p in reports[0]["devices"]) == [0, 1]


def test_the_mesh_is_spread_over_both_processes(reports: list[dict[str, Any]]) -> None:
    for report in reports:
        assert sorted(p for _, p in report["compiled_devices"]) == [0, 1]
        assert report["output_processes"] == [0, 1]
        # Alone, a process runs on its own device.
        assert [p for _, p in report["alone_devices"]] == [report["process_index"]]
        # tp's sums are all-reduces across the devices, so across the processes.
        assert report["collectives"].get("all-reduce", 0) >= 1
    # Both made the same device plan (multi-controller: the same program on every process).
    assert reports[0]["compiled_devices"] == reports[1]["compiled_devices"]


def test_the_numbers_are_one_process_numbers(reports: list[dict[str, Any]]) -> None:
    # Sums over tp now run across processes, so the values agree to rounding (as on two
    # devices of one process: docs/distributed.md, Numbers).
    for report in reports:
        scale = report["largest_value"]
        assert report["max_diff_vs_one_process"] <= 1e-5 * scale
        assert report["max_diff_vs_jax_jit"] <= 1e-5 * scale
    # Every process reads the same whole values: the loss directly (it is replicated), the
    # split weights once gathered.
    assert reports[0]["loss"] == reports[1]["loss"]
    assert reports[0]["digest"] == reports[1]["digest"]


def test_training_steps_stay_in_place(reports: list[dict[str, Any]]) -> None:
    # The warm steps fed each step's outputs back in: they were where the program takes its
    # inputs, so no step compiled again.
    for report in reports:
        assert report["xla_compiles"] == 1
        assert report["warm_step_ms"]["two_processes"] > 0

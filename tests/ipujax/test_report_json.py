"""The cost report's JSON: exact round trips, determinism, and clear errors for bad input."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import compile_for, spec

import ipujax


def _program(x: jax.Array, w: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ w)
    return jax.nn.softmax(h, axis=-1).sum(0)


ARGS = (spec((8, 32)), spec((32, 16)))


@pytest.fixture(scope="module")
def report() -> ipujax.CostReport:
    return compile_for(_program, *ARGS).cost_report()


def _data(report: ipujax.CostReport) -> dict:
    return json.loads(report.to_json())


def test_round_trip_is_exact(report: ipujax.CostReport) -> None:
    text = report.to_json()
    again = ipujax.CostReport.from_json(text)
    assert again == report
    assert again.to_json() == text
    assert again.supersteps == report.supersteps
    for field in dataclasses.fields(ipujax.CostReport):  # every field, records as tuples again
        if field.name not in ("tile_memory", "always_live"):
            assert getattr(again, field.name) == getattr(report, field.name), field.name
    assert all(isinstance(s, ipujax.SuperstepCost) for s in again.supersteps)
    np.testing.assert_array_equal(again.tile_memory, report.tile_memory)
    np.testing.assert_array_equal(again.always_live, report.always_live)
    assert again.tile_memory.shape == (1, 16)
    assert again.tile_memory.dtype == np.int64
    assert (again.total_cycles, again.seconds, again.fits) == (
        report.total_cycles,
        report.seconds,
        report.fits,
    )
    assert again.summary() == report.summary()


def test_round_trip_with_collectives_and_phases(report: ipujax.CostReport) -> None:
    richer = dataclasses.replace(
        report,
        collectives=(
            ipujax.CollectiveCost("all_reduce", ("data", "model"), 4, 1024, 777, "add", "f.py:3"),
        ),
        phases=(ipujax.PhaseCost("layer0", 1234, 4096, 5000),),
    )
    again = ipujax.CostReport.from_json(richer.to_json())
    assert again == richer
    assert again != report
    assert again.collectives == richer.collectives
    assert again.collectives[0].axes == ("data", "model")  # a tuple again, not a list
    assert again.phases == richer.phases


def test_reports_that_differ_are_not_equal(report: ipujax.CostReport) -> None:
    assert dataclasses.replace(report, total_cycles=report.total_cycles + 1) != report
    bumped = report.tile_memory.copy()
    bumped[0, 3] += 1
    assert dataclasses.replace(report, tile_memory=bumped) != report
    assert report != report.to_json()


def test_same_program_compiles_to_the_same_json() -> None:
    first = compile_for(_program, *ARGS).cost_report().to_json()
    second = compile_for(_program, *ARGS).cost_report().to_json()
    assert first == second
    assert ipujax.CostReport.from_json(first) == ipujax.CostReport.from_json(second)


def test_json_header(report: ipujax.CostReport) -> None:
    data = _data(report)
    assert data["schema"] == "ipujax.cost_report"
    assert data["version"] == 6
    assert data["tile_memory"] == report.tile_memory.tolist()
    assert len(data["supersteps"]) == len(report.supersteps)


# ---- malformed input -----------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "{", "not json", "{'single': 'quotes'}", None])
def test_not_json(text: object) -> None:
    with pytest.raises(ipujax.ReportError):
        ipujax.CostReport.from_json(text)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["[]", "3", '"a string"', "null", '{"version": 1}'])
def test_json_that_is_not_a_report(text: str) -> None:
    with pytest.raises(ipujax.ReportError, match="schema"):
        ipujax.CostReport.from_json(text)


def test_wrong_schema(report: ipujax.CostReport) -> None:
    data = _data(report)
    data["schema"] = "someone.else"
    with pytest.raises(ipujax.ReportError, match="schema"):
        ipujax.CostReport.from_json(json.dumps(data))


def test_version_1_reads_with_the_new_phase_fields_zero(report: ipujax.CostReport) -> None:
    data = _data(report)
    data["version"] = 1
    data["phases"] = [{"name": "layer0", "cycles": 10, "streaming_bytes": 8, "peak_tile_bytes": 4}]
    old = ipujax.CostReport.from_json(json.dumps(data))
    assert old.phases == (ipujax.PhaseCost("layer0", 10, 8, 4),)
    assert old.phases[0].load_bytes == old.phases[0].kept_bytes == 0


def test_memory_categories_round_trip_and_add_up(report: ipujax.CostReport) -> None:
    again = ipujax.CostReport.from_json(report.to_json())
    assert again.memory_categories == report.memory_categories
    assert again.top_tiles[0].categories == report.top_tiles[0].categories
    names = tuple(name for name, _ in report.memory_categories)
    assert names == (
        "variables_always_live",
        "variables_not_always_live",
        "vertex_code",
        "vertex_state",
        "exchange_code",
        "control_code",
        "stack",
    )
    assert tuple(name for name, _ in again.fullest_tile_categories) == names
    # One IPU's categories add up to its tiles' bytes; the fullest tile's to its bytes.
    assert sum(size for _, size in again.memory_categories) == int(report.tile_memory[0].sum())
    assert sum(size for _, size in again.fullest_tile_categories) == report.peak_tile_bytes
    data = _data(report)
    # In the JSON, [name, bytes] pairs.
    assert data["memory_categories"][0] == ["variables_always_live", report.memory_categories[0][1]]


def test_version_2_reads_without_categories(report: ipujax.CostReport) -> None:
    data = _data(report)
    data["version"] = 2
    del data["memory_categories"]
    for usage in data["top_tiles"]:
        del usage["categories"]
    old = ipujax.CostReport.from_json(json.dumps(data))
    assert old.memory_categories == () and old.fullest_tile_categories == ()
    assert old.top_tiles[0].tensors == report.top_tiles[0].tensors
    assert "by category" not in old.summary()
    assert "by category" in report.summary()


@pytest.mark.parametrize("bad", [[["vertex_code"]], [[3, 4]], "vertex_code", [["stack", "7"]]])
def test_bad_memory_categories(report: ipujax.CostReport, bad: object) -> None:
    data = _data(report)
    data["memory_categories"] = bad
    with pytest.raises(ipujax.ReportError, match="memory_categories"):
        ipujax.CostReport.from_json(json.dumps(data))


@pytest.mark.parametrize("version", [7, 0, "1", "2", None])
def test_wrong_version(report: ipujax.CostReport, version: object) -> None:
    data = _data(report)
    data["version"] = version
    with pytest.raises(ipujax.ReportError, match="version"):
        ipujax.CostReport.from_json(json.dumps(data))


def test_missing_version(report: ipujax.CostReport) -> None:
    data = _data(report)
    del data["version"]
    with pytest.raises(ipujax.ReportError, match="version"):
        ipujax.CostReport.from_json(json.dumps(data))


@pytest.mark.parametrize("field", ["total_cycles", "tile_memory", "supersteps", "clock_hz"])
def test_missing_field(report: ipujax.CostReport, field: str) -> None:
    data = _data(report)
    del data[field]
    with pytest.raises(ipujax.ReportError, match=field):
        ipujax.CostReport.from_json(json.dumps(data))


def test_bad_tile_memory_shape(report: ipujax.CostReport) -> None:
    data = _data(report)
    data["tile_memory"] = [row[:-1] for row in data["tile_memory"]]  # 15 tiles, not 16
    with pytest.raises(ipujax.ReportError):
        ipujax.CostReport.from_json(json.dumps(data))


def test_tile_memory_disagrees_with_the_tile_count(report: ipujax.CostReport) -> None:
    data = _data(report)
    data["tiles_per_ipu"] = 8
    with pytest.raises(ipujax.ReportError):
        ipujax.CostReport.from_json(json.dumps(data))


@pytest.mark.parametrize("bad", [["a"] * 16, "sixteen", [[1, 2], [3]]])
def test_bad_always_live(report: ipujax.CostReport, bad: object) -> None:
    data = _data(report)
    data["always_live"] = bad
    with pytest.raises(ipujax.ReportError):
        ipujax.CostReport.from_json(json.dumps(data))


def test_bad_superstep_records(report: ipujax.CostReport) -> None:
    data = _data(report)
    data["supersteps"] = [5]
    with pytest.raises(ipujax.ReportError):
        ipujax.CostReport.from_json(json.dumps(data))
    data = _data(report)
    del data["supersteps"][0]["compute_cycles"]
    with pytest.raises(ipujax.ReportError):
        ipujax.CostReport.from_json(json.dumps(data))


# ---- text ----------------------------------------------------------------------------------


def test_summary(report: ipujax.CostReport) -> None:
    text = report.summary()
    assert "total cycles" in text
    assert f"{report.total_cycles:,}" in text
    assert "fits" in text
    assert "fits: yes" in text
    assert "bow" in text
    assert "16 tiles/IPU" in text
    assert "dot_general" in text

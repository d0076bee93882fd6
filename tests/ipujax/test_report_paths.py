"""Source lines as a person names them: every place ipujax shows where an op came from (the
collectives' why and source in the tables, the JSON and the trace; `Compiled.explain()`) names
the file relative to the working directory, or from its package when installed; never by the
absolute path jax recorded."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import target
from jax.sharding import PartitionSpec as P
from rich.console import Console

import ipujax
from ipujax.views.html import render_html
from ipujax.views.tables import report_renderables
from ipujax.views.trace import trace_json
from lowering import shorten_paths

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().relative_to(ROOT).as_posix()  # tests/ipujax/test_report_paths.py


# ---- the one function ----------------------------------------------------------------------


def test_a_file_under_the_working_directory_is_relative(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "examples" / "gpt" / "model.py"
    assert shorten_paths(f"{model}:42") == "examples/gpt/model.py:42"


def test_an_installed_file_is_named_from_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    outside = "/usr/lib/python3.11/site-packages/flax/linen/linear.py:123"
    assert shorten_paths(outside) == "flax/linen/linear.py:123"
    # A virtualenv inside the project still reads as the package, not as .venv/lib/...
    inside = f"{tmp_path}/.venv/lib/python3.11/site-packages/flax/linen/linear.py:123"
    assert shorten_paths(inside) == "flax/linen/linear.py:123"


def test_other_files_stay_absolute_and_text_around_paths_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path / "..")
    elsewhere = "/opt/elsewhere/model.py:7"
    assert shorten_paths(elsewhere) == elsewhere
    mine = tmp_path / "model.py"
    why = f"operand 0 of add at {mine}:3 (elementwise rule); add at {elsewhere} runs whole"
    assert shorten_paths(why) == (
        f"operand 0 of add at {tmp_path.name}/model.py:3 (elementwise rule); "
        f"add at {elsewhere} runs whole"
    )
    # Already short: unchanged (so a report read back from its JSON writes the same JSON).
    assert shorten_paths("examples/gpt/model.py:42") == "examples/gpt/model.py:42"
    assert (
        shorten_paths("jit(f)/block/dot_general <unknown>") == "jit(f)/block/dot_general <unknown>"
    )


# ---- everywhere a program's source lines are shown ------------------------------------------


def contract(x, w):
    doubled = x * 2.0  # split as x is: explain() says where that came from
    # The contracted dimension is split: tanh needs the partial sums AllReduced first.
    return jnp.tanh(doubled @ w)


@pytest.fixture(scope="module")
def compiled() -> ipujax.Compiled:
    mesh = ipujax.make_mesh((2,), ("rows",), target=target(16))
    jitted = ipujax.jit(contract, mesh=mesh, in_shardings=(P(None, "rows"), P("rows", None)))
    x, w = np.ones((8, 16), np.float32), np.ones((16, 4), np.float32)
    with pytest.MonkeyPatch.context() as patch:  # the cost report is made as it compiles
        patch.chdir(ROOT)
        return jitted.lower(x, w).compile()


@pytest.fixture(autouse=True)
def _in_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    """The working directory a user runs ipujax from: the project holding the program."""
    monkeypatch.chdir(ROOT)


def _no_absolute_path(text: str) -> None:
    assert f"{ROOT}/" not in text
    assert f"{HERE}:" in text


def test_explain_names_files_from_the_working_directory(compiled: ipujax.Compiled) -> None:
    _no_absolute_path(compiled.explain())


def test_the_collectives_why_and_source_are_relative(compiled: ipujax.Compiled) -> None:
    report = compiled.cost_report()
    (collective,) = report.collectives
    assert collective.why.startswith(f"operand 0 of tanh at {HERE}:")
    _no_absolute_path(collective.source)
    console = Console(width=400, record=True, file=io.StringIO())
    for renderable in report_renderables(report, full=True):
        console.print(renderable)
    _no_absolute_path(console.export_text())
    _no_absolute_path(render_html(report))
    data = json.loads(report.to_json())
    _no_absolute_path(data["collectives"][0]["why"])
    _no_absolute_path(data["collectives"][0]["source"])
    assert ipujax.CostReport.from_json(report.to_json()) == report
    trace = trace_json(report)
    _no_absolute_path(trace)
    assert any(
        f"{HERE}:" in event["args"].get("why", "")
        for event in json.loads(trace)["traceEvents"]
        if "args" in event
    )


def test_a_report_with_absolute_paths_reads_relative_in_every_view(
    compiled: ipujax.Compiled,
) -> None:
    """A report written before reports named files relatively (its JSON round-trips exactly,
    absolute paths and all): the views shorten what they show themselves."""
    report = compiled.cost_report()
    (collective,) = report.collectives
    absolute = f"{ROOT}/{HERE}:9"
    old = dataclasses.replace(
        collective, source=absolute, why=f"operand 0 of tanh at {absolute} (elementwise rule)"
    )
    report = dataclasses.replace(report, collectives=(old,))
    for full in (True, False):  # every collective with its why; grouped by source line
        console = Console(width=400, record=True, file=io.StringIO())
        for renderable in report_renderables(report, full=full):
            console.print(renderable)
        assert f"{ROOT}/" not in console.export_text()
    for text in (render_html(report), trace_json(report)):
        _no_absolute_path(text)

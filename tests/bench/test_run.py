"""The benchmark runner (benchmarks/run.py and its modules) on tiny inputs, so that it cannot rot.

Every section runs once (module fixture) in `--quick` form: the tiny GPT on 16-tile Bow IPUs,
the child processes included (XLA's SPMD partitioner over forced host devices, a cost-only
compile, memory per tile count). Nothing about timings is asserted, only that each section
produces its table, that ipujax's outputs agree with jax.jit's and that RESULTS.md renders.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import results
import run as bench
from results import Section
from setups import QUICK


def _rows(table: str) -> list[dict[str, str]]:
    """A Markdown table's body rows, keyed by the header's cells."""
    lines = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()]
    header, body = lines[0], lines[2:]
    return [dict(zip(header, row, strict=True)) for row in body]


@pytest.fixture(scope="module")
def sections() -> dict[str, Section]:
    timings: dict[str, float] = {}
    measured = bench.measure(QUICK, bench.SECTIONS, repeats=1, timings=timings)
    assert "run + compile" in timings
    return {s.name: s for s in measured}


def test_every_section_has_a_table(sections: dict[str, Section]) -> None:
    assert list(sections) == list(bench.SECTIONS)
    for section in sections.values():
        assert _rows(section.table), section.name
        assert section.meaning


def test_ipujax_agrees_with_jax(sections: dict[str, Section]) -> None:
    (row,) = _rows(sections["run"].table)
    assert row["mesh"] == "2 IPUs (tp=2)"
    assert float(row["max abs diff"]) < 1e-4
    assert float(row["ipujax s"]) > 0 and float(row["jax.jit s"]) > 0


def test_ecosystem_models_agree_with_jax(sections: dict[str, Section]) -> None:
    rows = _rows(sections["ecosystem"].table)
    assert {r["model"] for r in rows} == {
        "flax.linen transformer block",
        "equinox MLP",
        "haiku MLP with BatchNorm",
    }
    for row in rows:
        assert row["mesh"] == "2 IPUs (tp=2)" and float(row["max abs diff"]) < 1e-4
        assert float(row["ipujax total s"]) > 0 and float(row["jax.jit total s"]) > 0


def test_the_scanned_transformer_runs_on_the_run_meshes(sections: dict[str, Section]) -> None:
    # The loops section's scans on their dp mesh, then the scan transformer on each run mesh.
    rows = [r for r in _rows(sections["loops"].table) if r["mesh"] == "2 IPUs (tp=2)"]
    assert len(rows) == len(QUICK.meshes)
    for row in rows:
        assert row["program"].startswith("scan transformer")
        assert float(row["max abs diff"]) < 1e-4 and "ratio <= 1.25" in row["goal"]


def test_spmd_counts_collectives_on_both_sides(sections: dict[str, Section]) -> None:
    (row,) = _rows(sections["spmd"].table)
    assert "all_reduce" in row["XLA collectives"] and "all_reduce" in row["ipujax collectives"]
    assert int(row["XLA B/device"].replace(",", "")) > 0
    assert float(row["loss diff"]) < 1e-4


def test_goals_are_judged(sections: dict[str, Section]) -> None:
    goals = [g for s in sections.values() for g in s.goals]
    # run and compile one per mesh, the outputs' agreement, the three ecosystem models' first
    # calls per mesh, two for the cost-only compile, one per memory program, one for the CNN
    # step's run time, two scans' first calls, the scan transformer's per mesh and two for
    # GPT-3 at PopXL's batch (loops), one for the fidelity band, one per plan search
    meshes = len(QUICK.meshes)
    plans = len(QUICK.plans)
    ecosystem = 3 * meshes
    memory = len(QUICK.memory_programs)
    scans = 2 + meshes
    assert len(goals) == 2 * meshes + 1 + ecosystem + 2 + memory + 1 + scans + 2 + 1 + plans
    assert any(what.startswith("ipujax plan") for what, _ in goals)
    assert any(what.startswith("CNN run time ratio") for what, _ in goals)
    assert sum(what.startswith("scan first call ratio") for what, _ in goals) == scans
    assert sum(what.startswith("first call ratio, equinox") for what, _ in goals) == meshes
    assert sum(what.startswith("first call ratio, haiku") for what, _ in goals) == meshes
    assert all(isinstance(met, bool) for _, met in goals)
    assert any(what.startswith("outputs agree") and met for what, met in goals)


def test_results_render_and_write(sections: dict[str, Section], tmp_path: Path) -> None:
    text = results.render(list(sections.values()), results.machine(), "python x", {"total": 1.0})
    for section in sections.values():
        assert f"## {section.title}" in text
    assert "## Machine" in text and "jax / jaxlib" in text and "What each number means" in text
    path = tmp_path / "RESULTS.md"
    results.write_atomically(path, text)
    assert path.read_text() == text
    assert [p.name for p in tmp_path.iterdir()] == ["RESULTS.md"]  # no temporary left


def test_a_busy_machine_is_said_at_the_top_of_the_goals(sections: dict[str, Section]) -> None:
    assert results.busy_warning(results.QUIET_LOAD) == []
    (warning,) = results.busy_warning(1.5)
    assert "1-minute load 1.50" in warning
    text = results.render([sections["run"]], [], "python x", {"total": 1.0}, [warning])
    goals = text.split("## Goals\n\n", 1)[1]
    assert goals.startswith(warning + "\n- ")


def test_unknown_sections_are_refused() -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--only", "run,speed"])
    assert bench.parse_args(["--only", "gpt3, memory"]).only == ["gpt3", "memory"]


def test_fidelity_runs_the_figures_it_names(sections: dict[str, Section]) -> None:
    (row,) = _rows(sections["fidelity"].table)
    assert row["figure"] == "AMP vertex, fp16 [16, 16] x [16, 16] per tile, Bow"
    assert 0.75 <= float(row["ratio"]) <= 1.33
    assert sections["fidelity"].files == ()  # only the whole table rewrites docs/fidelity.md

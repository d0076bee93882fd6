"""`ipujax cost-report`: the tables, the JSON it writes, how --target/--mesh/--phases reach the
workload, and `python -m ipujax` as a subprocess."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import workloads
from helpers import run_python
from test_trace import check_chrome_trace
from workloads import SPEC_FILE as WORKLOADS

import ipujax
from ipujax.cli import main
from ipujax.report import CostReport


def _direct_report(factory, mesh=None) -> CostReport:
    """What the CLI should print: the workload compiled through the API."""
    result = factory(mesh=mesh) if mesh is not None else factory()
    fun, args, kwargs = result if len(result) == 3 else (*result, {})
    lowered = ipujax.jit(fun, **kwargs).lower(*args)
    return lowered.compile(check_memory_fits=False).cost_report()


FULL_ONLY = (
    "Memory: tiles by bytes",
    "Memory: fullest tiles and their largest tensors",
    "Memory: always-live against not-always-live",
)


def test_full_adds_the_tile_tables_and_every_collective(gpt_files, capsys) -> None:
    assert main(["report", "show", str(gpt_files.json), "--full"]) == 0
    out = capsys.readouterr().out
    for title in FULL_ONLY:
        assert title in out, title


def test_tables_and_json_match_the_api(gpt_files) -> None:
    mesh = ipujax.make_mesh((1,), ("ipu",), target=ipujax.Target.bow())
    expected = _direct_report(workloads.tiny_gpt_step, mesh)
    saved = CostReport.from_json(gpt_files.json.read_text())
    assert saved == expected
    assert CostReport.from_json(expected.to_json()) == saved

    out = gpt_files.out
    # The default fits a screen; `--full` (below) adds the tiles' histogram, the fullest tiles
    # and live ranges, and every collective.
    for title in FULL_ONLY:
        assert title not in out, title
    for title in (
        "Summary",
        "Memory: peak per IPU",
        "Memory: by category",
        "Execution: cycles by superstep kind",
        "Execution: cycles by op and source line",
        "Execution: tile balance",
        "Communication",
    ):
        assert title in out, title
    assert f"{expected.total_cycles:,}" in out
    assert re.search(r"fits\s+yes", out)
    assert "Collectives (IPU-Link bytes): none" in out
    assert "Phases: none (phases=None)" in out
    assert re.search(r"host\s+[\d.,]+ [KMG]?i?B in [\d,]+ cycles not hidden", out)
    assert "examples/tiny_gpt.py:" in out  # source lines, shortened
    assert f"{100 * expected.flop_utilisation:.2f}% of peak" in out
    assert f"wrote cost report JSON to {gpt_files.json}" in out


def test_target_reaches_a_workload_that_takes_a_mesh(cli, tmp_path: Path) -> None:
    path = tmp_path / "mk2.json"
    run = cli("cost-report", f"{WORKLOADS}:tiny_gpt_step", "--target", "mk2", "--json", str(path))
    assert run.code == 0, run.err
    report = CostReport.from_json(path.read_text())
    assert report.target == "mk2"
    assert re.search(r"target\s+mk2", run.out)


def test_flags_override_the_mesh_of_jit_kwargs(cli, tmp_path: Path) -> None:
    path = tmp_path / "mk1.json"
    run = cli("cost-report", f"{WORKLOADS}:mlp_16_tiles", "--target", "mk1", "--json", str(path))
    assert run.code == 0, run.err
    report = CostReport.from_json(path.read_text())
    assert (report.target, report.tiles_per_ipu) == ("mk1", 1216)
    # without flags, the workload's own mesh (a Bow cut to 16 tiles) stands
    run = cli("cost-report", f"{WORKLOADS}:mlp_16_tiles", "--json", str(path))
    assert CostReport.from_json(path.read_text()).tiles_per_ipu == 16


def test_module_spec(cli, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(Path(WORKLOADS).parent))
    path = tmp_path / "mlp.json"
    run = cli("cost-report", "workloads:mlp", "--json", str(path))
    assert run.code == 0, run.err
    assert CostReport.from_json(path.read_text()) == _direct_report(workloads.mlp)


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")  # about memory: x is 1.9 GB
def test_a_report_that_does_not_fit_still_prints(cli) -> None:
    run = cli("cost-report", f"{WORKLOADS}:too_big")
    assert run.code == 0, run.err
    assert re.search(r"fits\s+NO", run.out)
    assert "Memory: fullest tiles" in run.out  # what is on the tiles over budget
    full = cli("cost-report", f"{WORKLOADS}:too_big", "--full")
    assert "(over)" in full.out  # the histogram marks bins over the budget


def _one_line_error(run) -> str:
    assert run.code == 2, run
    lines = run.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ipujax: error: "), run.err
    assert "Traceback" not in run.err and run.out == ""
    return lines[0]


def test_a_config_error_is_one_clear_line(cli) -> None:
    line = _one_line_error(cli("cost-report", f"{WORKLOADS}:mlp", "--mesh", "dp=512"))
    assert "Pod256" in line  # make_mesh's ConfigError, passed on


def test_several_ipus_compile_or_fail_in_one_line(cli, tmp_path: Path) -> None:
    """A mesh of several IPUs, and phases: either ipujax runs them and the report covers every
    IPU, or it says in one line that it does not yet (a ConfigError)."""
    report_path, trace_path = tmp_path / "dp4.json", tmp_path / "dp4.trace.json"
    run = cli(
        "cost-report",
        f"{WORKLOADS}:mlp_data_parallel",
        "--mesh",
        "dp=4",
        "--json",
        str(report_path),
        "--trace",
        str(trace_path),
    )
    if run.code != 0:
        _one_line_error(run)
    else:
        report = CostReport.from_json(report_path.read_text())
        assert report.ipus == 4 and re.search(r"IPUs\s+4\b", run.out)
        slices = check_chrome_trace(json.loads(trace_path.read_text()))
        assert {e["pid"] for e in slices} == {0, 1, 2, 3}
        if report.collectives:
            assert "Collectives (IPU-Link bytes): none" not in run.out
            assert any(e["cat"] == "GlobalExchange" for e in slices)
    run = cli("cost-report", f"{WORKLOADS}:mlp", "--phases", "auto")
    if run.code != 0:
        assert "phase" in _one_line_error(run)


def test_version_and_help(cli) -> None:
    run = cli("--version")
    assert run.code == 0 and run.out.startswith("ipujax ")
    run = cli()
    assert run.code == 0 and "cost-report" in run.out


def _python_m(*argv: str) -> subprocess.CompletedProcess[str]:
    return run_python("-m", "ipujax", *argv, COLUMNS="120")


def test_python_dash_m_as_a_subprocess() -> None:
    good = _python_m("cost-report", "tests/cli/workloads.py:mlp")
    assert good.returncode == 0, good.stderr
    assert "Summary" in good.stdout and "Traceback" not in good.stderr
    bad = _python_m("cost-report", "tests/cli/workloads.py:mlp", "--mesh", "dp2")
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == [bad.stderr.strip()]
    assert bad.stderr.startswith("ipujax: error:")


def test_gpt2_small_on_dp2_tp2_fits_a_screen(cli, monkeypatch) -> None:
    """Issue 19: the GPT-2 workload's default report, which does not fit its tiles unphased,
    in under 120 lines at the width the CLI prints to a pipe (120 columns)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    spec = str(Path(__file__).resolve().parents[2] / "examples/gpt/workloads.py") + ":gpt2_small"
    run = cli("cost-report", spec, "--mesh", "dp=2,tp=2")
    assert run.code == 0, run.err
    assert re.search(r"fits\s+NO", run.out)
    assert len(run.out.splitlines()) < 120
    assert re.search(r"Collectives \(IPU-Link bytes\): \d+ in \d+ groups", run.out)

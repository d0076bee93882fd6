"""`ipujax report show` and `ipujax report diff` on saved reports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from workloads import SPEC_FILE as WORKLOADS

from ipujax.report import CostReport


@pytest.fixture(scope="module")
def mlp_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The MLP on a full Bow (1,472 tiles), on 16 tiles, and on an MK2."""
    from ipujax.cli import main

    folder = tmp_path_factory.mktemp("mlp")
    paths = {}
    for name, spec, flags in (
        ("bow", "mlp", []),
        ("tiles16", "mlp_16_tiles", []),
        ("mk2", "mlp", ["--target", "mk2"]),
    ):
        paths[name] = folder / f"{name}.json"
        assert main(["cost-report", f"{WORKLOADS}:{spec}", *flags, "--json", str(paths[name])]) == 0
    return paths


def _without_notes(out: str) -> str:
    return "\n".join(line for line in out.splitlines() if not line.startswith("wrote "))


def test_show_prints_the_same_tables(cli, gpt_files) -> None:
    run = cli("report", "show", str(gpt_files.json))
    assert run.code == 0, run.err
    assert _without_notes(run.out).strip() == _without_notes(gpt_files.out).strip()


def test_show_writes_views_of_a_saved_report(cli, gpt_files, tmp_path: Path) -> None:
    trace, page = tmp_path / "t.json", tmp_path / "p.html"
    run = cli("report", "show", str(gpt_files.json), "--trace", str(trace), "--html", str(page))
    assert run.code == 0, run.err
    assert trace.read_text() == gpt_files.trace.read_text()
    assert page.read_text() == gpt_files.html.read_text()


def test_diff_of_16_against_1472_tiles(cli, mlp_reports) -> None:
    a = CostReport.from_json(mlp_reports["tiles16"].read_text())
    b = CostReport.from_json(mlp_reports["bow"].read_text())
    run = cli("report", "diff", str(mlp_reports["tiles16"]), str(mlp_reports["bow"]))
    assert run.code == 0, run.err
    out = run.out
    for title in ("Summary", "Cycles by op", "Memory"):
        assert re.search(rf"^{title}\b", out, re.M), title
    assert re.search(r"tiles per IPU\s+16\s+1,472\s+\+1,456\s+\+9100\.00%", out)
    delta = b.total_cycles - a.total_cycles
    percent = 100 * delta / a.total_cycles
    assert re.search(
        rf"total cycles\s+{a.total_cycles:,}\s+{b.total_cycles:,}\s+{delta:+,}\s+"
        rf"{percent:+.2f}%",
        out,
    )
    assert re.search(r"dot_general\s+[\d,]+\s+[\d,]+\s+[-+][\d,]+\s+[-+][\d.]+%", out)
    assert "tiles16.json" in out and "bow.json" in out  # columns are named by file


def test_diff_of_mk2_against_bow_changes_time_not_cycles(cli, mlp_reports) -> None:
    """The same chip at another clock: the same cycles on it. The host transfers move their
    bytes in the same seconds whatever the clock, so the step's total cycles differ."""
    run = cli("report", "diff", str(mlp_reports["mk2"]), str(mlp_reports["bow"]))
    assert run.code == 0, run.err
    assert re.search(r"target\s+mk2\s+bow\s+changed", run.out)
    for kind in ("compute", "exchange", "sync"):
        assert re.search(rf"{kind} cycles(\s+[\d,]+){{2}}\s+0\s+0%", run.out), kind
    a = CostReport.from_json(mlp_reports["mk2"].read_text())
    b = CostReport.from_json(mlp_reports["bow"].read_text())
    device = [sum(s.cycles for s in r.supersteps if s.kind != "host") for r in (a, b)]
    assert device[0] == device[1]
    assert a.seconds > b.seconds


def test_diff_of_a_report_with_itself_has_no_deltas(cli, gpt_files) -> None:
    run = cli("report", "diff", str(gpt_files.json), str(gpt_files.json))
    assert run.code == 0, run.err
    rows = [line for line in run.out.splitlines() if re.match(r"\s+(total cycles|FLOPs)\s", line)]
    assert rows and all(line.split()[-2:] == ["0", "0%"] for line in rows)


def test_diff_shows_the_host_and_the_calls(cli, tmp_path: Path) -> None:
    # Two reports of one step, 16 calls per host transfer in the second: the same cycles, but
    # calls per second 13.6x higher, which the diff showed as no change at all before.
    import jax.numpy as jnp

    import ipujax

    paths = []
    for name, iterations in (("one", 1), ("sixteen", 16)):
        jitted = ipujax.jit(lambda w, x: w @ x, resident_argnums=0, device_iterations=iterations)
        report = jitted.lower(jnp.ones((64, 64)), jnp.ones(64)).compile().cost_report()
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(report.to_json())
    run = cli("report", "diff", *map(str, paths))
    assert run.code == 0, run.err
    assert re.search(r"device iterations\s+1\s+16\s+\+15", run.out)
    assert re.search(r"calls per second\s+[\d,.]+/s\s+[\d,.]+/s\s+\+[\d,.]+/s", run.out)
    assert re.search(r"host bytes\s+512 B\s+512 B\s+0", run.out)
    assert re.search(r"numerics\s+exact\s+exact\s+=", run.out)

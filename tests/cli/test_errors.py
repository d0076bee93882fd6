"""Every user error is one line on stderr, `ipujax: error: ...`, exit code 2, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from workloads import SPEC_FILE as WORKLOADS

from ipujax.cli import main


def _bad_files(tmp_path: Path) -> dict[str, Path]:
    files = {
        "not_json": "{ this is not json",
        "wrong_schema": json.dumps({"schema": "something.else", "version": 1}),
        "cut_short": json.dumps({"schema": "ipujax.cost_report", "version": 1, "target": "bow"}),
        "bad_version": json.dumps({"schema": "ipujax.cost_report", "version": 99}),
    }
    out = {}
    for name, text in files.items():
        out[name] = tmp_path / f"{name}.json"
        out[name].write_text(text)
    return out


CASES = {
    "missing file": ["cost-report", "no/such/file.py:f"],
    "no such module": ["cost-report", "no_such_package.module:f"],
    "no NAME": ["cost-report", WORKLOADS],
    "no such attribute": ["cost-report", f"{WORKLOADS}:no_such_workload"],
    "not callable": ["cost-report", f"{WORKLOADS}:not_callable"],
    "bad return shape": ["cost-report", f"{WORKLOADS}:bad_shape"],
    "arguments the step does not take": ["cost-report", f"{WORKLOADS}:wrong_arity"],
    "bad mesh syntax": ["cost-report", f"{WORKLOADS}:mlp", "--mesh", "dp2"],
    "zero mesh size": ["cost-report", f"{WORKLOADS}:mlp", "--mesh", "dp=0"],
    "unknown target": ["cost-report", f"{WORKLOADS}:mlp", "--target", "mk3"],
    "bad phases": ["cost-report", f"{WORKLOADS}:mlp", "--phases", "sometimes"],
    "unknown flag": ["cost-report", f"{WORKLOADS}:mlp", "--frobnicate"],
    "unknown command": ["compile-everything"],
    "report without action": ["report"],
    "missing report": ["report", "show", "no_such_report.json"],
    "malformed JSON": ["report", "show", "{not_json}"],
    "wrong schema": ["report", "show", "{wrong_schema}"],
    "report cut short": ["report", "diff", "{cut_short}", "{cut_short}"],
    "unsupported version": ["report", "diff", "{bad_version}", "{not_json}"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_line_exit_2(case: str, tmp_path: Path, capsys) -> None:
    files = _bad_files(tmp_path)
    argv = [a.format(**files) if a.startswith("{") else a for a in CASES[case]]
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 2, captured
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("ipujax: error: ")
    assert "Traceback" not in captured.err
    assert captured.out == ""


def test_messages_name_the_problem(capsys) -> None:
    main(["cost-report", f"{WORKLOADS}:not_callable"])
    assert "not a callable" in capsys.readouterr().err
    main(["cost-report", f"{WORKLOADS}:mlp", "--mesh", "dp2"])
    assert "NAME=SIZE" in capsys.readouterr().err
    main(["cost-report", f"{WORKLOADS}:mlp", "--target", "mk3"])
    assert "bow, mk2, mk1" in capsys.readouterr().err
    main(["cost-report", f"{WORKLOADS}:wrong_arity"])
    assert "workloads.py:" in (err := capsys.readouterr().err) and "'w'" in err


def test_genuine_bugs_keep_their_traceback(tmp_path: Path) -> None:
    spec = tmp_path / "buggy.py"
    spec.write_text("def workload():\n    raise ZeroDivisionError('a bug in the workload')\n")
    with pytest.raises(ZeroDivisionError):
        main(["cost-report", f"{spec}:workload"])


def test_a_workload_refusing_its_mesh_is_one_line(tmp_path: Path, capsys) -> None:
    spec = tmp_path / "picky.py"
    spec.write_text(
        "def workload(mesh=None):\n    raise ValueError('12 heads do not split over 8')\n"
    )
    assert main(["cost-report", f"{spec}:workload", "--mesh", "tp=8"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "refuses the mesh tp=8" in err and "12 heads do not split over 8" in err
    assert f"{spec}:2" in err  # the line that raised it

"""`ipujax plan SPEC --system NAME`: the ranked plans of a workload as a table and as JSON, and
its user errors as one line on stderr with exit code 2."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from ipujax.cli import main
from ipujax.planning import meshes

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _at_the_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Specs relative to the repository root, a fixed table width, and `sys.path` as it was
    (loading a spec file puts its folder there)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.setattr(sys, "path", [*sys.path])


def _one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ipujax: error: ")
    assert "Traceback" not in err
    return lines[0]


def test_tiny_gpt_on_a_bow(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.json"
    argv = ["plan", "examples/gpt/workloads.py:tiny", "--system", "bow", "--json", str(path)]
    code = main([*argv, "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == ""  # --quiet: no progress lines
    assert "Plans for a bow (4 bow IPUs)" in out
    assert "best: ipujax cost-report examples/gpt/workloads.py:tiny --mesh " in out
    assert f"wrote the ranked plans to {path}" in out

    data = json.loads(path.read_text())
    assert (data["system"], data["ipus"], data["target"]) == ("bow", 4, "bow")
    plans = data["plans"]
    assert plans and [p["rank"] for p in plans] == list(range(1, len(plans) + 1))
    for plan in plans:
        assert math.prod(plan["mesh"].values()) == 4
    fits = [p["fits"] for p in plans]
    assert fits == sorted(fits, reverse=True)
    for group in (True, False):
        rates = [p["samples_per_second"] for p in plans if p["fits"] is group]
        assert rates == sorted(rates, reverse=True)
    # every mesh of 4 IPUs is costed or skipped with its reason
    costed = {tuple(p["mesh"].items()) for p in plans}
    skipped = {tuple(s["mesh"].items()) for s in data["skipped"]}
    assert costed | skipped == set(meshes(4))
    assert {"dp": 4} in [p["mesh"] for p in plans]
    pipelined = [p for p in plans if "pp" in p["mesh"]]
    assert pipelined and all(p["pipeline"]["axis"] == "pp" for p in pipelined)


def test_unknown_system(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.json"
    argv = ["plan", "examples/gpt/workloads.py:tiny", "--system", "nonsense", "--json", str(path)]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2
    assert "unknown system" in _one_error_line(err)
    assert out == ""
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


def test_a_factory_without_a_mesh_keyword(tmp_path: Path, capsys) -> None:
    workload = tmp_path / "meshless.py"
    workload.write_text(
        "import numpy as np\n\n\n"
        "def step():\n"
        "    return (lambda x: x * 2.0), (np.ones(4, np.float32),)\n"
    )
    code = main(["plan", f"{workload}:step", "--system", "bow"])
    out, err = capsys.readouterr()
    assert code == 2
    assert "must take a mesh keyword" in _one_error_line(err)
    assert out == ""


def test_meshes_the_workload_refuses_are_skipped(tmp_path: Path, capsys) -> None:
    """A factory's ValueError for a mesh it cannot split over is that mesh skipped, as `ipujax
    cost-report --mesh` makes it one error line: the plan still ranks the meshes it takes."""
    workload = tmp_path / "picky.py"
    workload.write_text(
        "import numpy as np\n\n\n"
        "def step(mesh=None):\n"
        "    if mesh is not None and 'dp' not in mesh.shape:\n"
        "        raise ValueError('this step splits over dp only')\n"
        "    return (lambda x: x * 2.0), (np.ones((8, 4), np.float32),)\n"
    )
    path = tmp_path / "plans.json"
    code = main(["plan", f"{workload}:step", "--system", "2", "--json", str(path)])
    capsys.readouterr()
    assert code == 0
    data = json.loads(path.read_text())
    assert data["plans"] and all("dp" in plan["mesh"] for plan in data["plans"])
    refused = [s for s in data["skipped"] if s["reason"] == "not expressible"]
    assert refused and all("dp only" in s["detail"] for s in refused)

"""Shared fixtures of the CLI tests: the CLI run in-process, and one tiny-GPT cost report with its
JSON, trace and HTML files, made once per session."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # workloads.py and pngdecode.py

WORKLOADS = str(HERE / "workloads.py")


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Runs `ipujax.cli.main(argv)` and returns its exit code and what it printed."""
    from ipujax.cli import main

    def run(*argv: str) -> Run:
        capsys.readouterr()
        code = main(list(argv))
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


@dataclass(frozen=True)
class GptFiles:
    out: str
    json: Path
    trace: Path
    html: Path


@pytest.fixture(scope="session")
def gpt_files(tmp_path_factory: pytest.TempPathFactory) -> GptFiles:
    """`ipujax cost-report workloads.py:tiny_gpt_step --json --trace --html`, run once."""
    import contextlib
    import io

    from ipujax.cli import main

    folder = tmp_path_factory.mktemp("gpt")
    paths = {
        kind: folder / f"report.{ext}"
        for kind, ext in (("json", "json"), ("trace", "trace.json"), ("html", "html"))
    }
    out, err = io.StringIO(), io.StringIO()
    argv = ["cost-report", f"{WORKLOADS}:tiny_gpt_step"]
    for kind, path in paths.items():
        argv += [f"--{kind}", str(path)]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code == 0, err.getvalue()
    return GptFiles(out.getvalue(), paths["json"], paths["trace"], paths["html"])


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fixed table width, whatever terminal runs the tests."""
    monkeypatch.setenv("COLUMNS", "120")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

"""Atomic writes: the destination is the old file or the whole new one, and no temporary file is
left behind, whatever fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ipujax.cli import main
from ipujax.views import atomic
from ipujax.views.atomic import write_atomic


def test_writes_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    write_atomic(path, "first")
    path.chmod(0o640)
    write_atomic(path, "second")
    assert path.read_text() == "second"
    assert path.stat().st_mode & 0o777 == 0o640  # an existing file keeps its mode
    assert os.listdir(tmp_path) == ["out.json"]


def _boom(*args: object, **kwargs: object) -> None:
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize("where", ["replace", "fsync", "write"])
@pytest.mark.parametrize("existing", [True, False])
def test_a_failure_leaves_the_destination_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, existing: bool
) -> None:
    path = tmp_path / "report.html"
    if existing:
        path.write_text("previous")
    if where == "write":
        real_fdopen = os.fdopen

        class Failing:
            def __init__(self, *args: object, **kwargs: object) -> None:
                self.file = real_fdopen(*args, **kwargs)  # type: ignore[call-overload]

            def __enter__(self) -> Failing:
                return self

            def __exit__(self, *exc: object) -> None:
                self.file.close()

            def write(self, data: bytes) -> int:
                self.file.write(data[: len(data) // 2])  # half written, then the disk fills
                raise OSError(28, "No space left on device")

        monkeypatch.setattr(atomic.os, "fdopen", Failing)
    else:
        monkeypatch.setattr(atomic.os, where, _boom)
    with pytest.raises(OSError, match="No space"):
        write_atomic(path, "x" * 100_000)
    assert os.listdir(tmp_path) == (["report.html"] if existing else [])
    if existing:
        assert path.read_text() == "previous"


def test_the_cli_reports_a_failed_write_as_one_line(
    gpt_files, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    page = tmp_path / "page.html"
    page.write_text("previous")
    monkeypatch.setattr(atomic.os, "replace", _boom)
    assert main(["report", "show", str(gpt_files.json), "--html", str(page)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ipujax: error: cannot write HTML report") and len(err.splitlines()) == 1
    assert page.read_text() == "previous"
    assert os.listdir(tmp_path) == ["page.html"]


def test_the_cli_writes_nothing_into_a_missing_folder(gpt_files, tmp_path: Path, capsys) -> None:
    target = tmp_path / "no" / "such" / "folder" / "r.json"
    assert main(["report", "show", str(gpt_files.json), "--trace", str(target)]) == 2
    assert "cannot write Chrome/Perfetto trace" in capsys.readouterr().err
    assert not (tmp_path / "no").exists()


def test_no_file_is_written_when_a_later_one_cannot_be(gpt_files, tmp_path: Path, capsys) -> None:
    # The paths are checked before any work: the HTML report, which comes first and could be
    # written, is not left behind by a run that fails on its trace.
    page, trace = tmp_path / "page.html", tmp_path / "missing" / "t.json"
    assert (
        main(["report", "show", str(gpt_files.json), "--html", str(page), "--trace", str(trace)])
        == 2
    )
    err = capsys.readouterr().err
    assert "(--trace): there is no folder" in err and len(err.splitlines()) == 1
    assert os.listdir(tmp_path) == []


def test_a_folder_is_not_an_output_file(gpt_files, tmp_path: Path, capsys) -> None:
    assert main(["report", "show", str(gpt_files.json), "--html", str(tmp_path)]) == 2
    assert "(--html): it is a folder" in capsys.readouterr().err

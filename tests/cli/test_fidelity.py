"""`ipujax fidelity`: every published figure within 0.75-1.33x, the table reproduced by one
command, docs/fidelity.md in step with the figures, and a figure outside the band failing."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipujax import fidelity
from ipujax.cli import main

DOCS = Path(__file__).resolve().parents[2] / "docs" / "fidelity.md"


@pytest.fixture(scope="module")
def rows() -> list[fidelity.Row]:
    return fidelity.run()


def test_every_figure_is_within_the_band(rows: list[fidelity.Row]) -> None:
    assert len(rows) == len(fidelity.FIGURES) >= 8
    outside = [(r.figure.name, round(r.ratio, 3)) for r in rows if not r.within]
    assert not outside, outside
    for row in rows:
        assert row.figure.source and row.figure.what and row.ipujax > 0


def test_the_amp_vertex_is_close_to_the_measurement(rows: list[fidelity.Row]) -> None:
    # PopLibs' vertex formula against tessellate-ipu's measurement: within 2%, not just 33%.
    amp = [r for r in rows if r.figure.name.startswith("AMP vertex")]
    assert len(amp) == 4
    assert all(abs(r.ratio - 1) < 0.02 for r in amp), [(r.figure.name, r.ratio) for r in amp]


def test_docs_hold_every_figure() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for figure in fidelity.FIGURES:
        assert f"| {figure.name} |" in text, figure.name


def test_the_command_prints_and_writes_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fidelity.md"
    assert main(["fidelity", "--only", "[16, 16] x [16", "--markdown", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "402 cycles" in printed and "409 cycles" in printed and "1.02" in printed
    text = out.read_text(encoding="utf-8")
    assert text.startswith("# Fidelity")
    assert (
        "| AMP vertex, fp16 [16, 16] x [16, 16] per tile, Bow | 402 cycles | 409 cycles |" in text
    )


def test_an_unknown_figure_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fidelity", "--only", "ResNet-1000"]) == 2
    err = capsys.readouterr().err
    assert "ResNet-1000" in err and "AMP vertex" in err


def test_a_figure_outside_the_band_fails_the_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = fidelity.Figure("made up", 100.0, "cycles", "nowhere", lambda: 50.0, "nothing")
    monkeypatch.setattr(fidelity, "FIGURES", (wrong,))
    assert main(["fidelity"]) == 1
    assert "0.50 (outside)" in capsys.readouterr().out
    row = fidelity.Row(wrong, 50.0)
    assert row.ratio == 0.5 and not row.within
    assert fidelity.Row(wrong, 75.0).within and fidelity.Row(wrong, 133.0).within
    assert not fidelity.Row(wrong, 133.5).within


def _row(published: float, ipujax: float, kind: str = fidelity.OPS) -> fidelity.Row:
    figure = fidelity.Figure("f", published, "x", "s", lambda: ipujax, "w", kind=kind)
    return fidelity.Row(figure, ipujax)


def test_the_error_summary_by_hand() -> None:
    # |error|s 10% and 30% (single ops), 50% (a whole system): mean 30%, max 50% over all.
    rows = [_row(100, 110), _row(10, 7), _row(2, 3, fidelity.SYSTEMS)]
    assert [round(r.error, 9) for r in rows] == [0.1, 0.3, 0.5]
    assert fidelity.error_summary(rows) == (
        "|error| mean 30.0%, max 50.0% over 3 rows; single ops, layers and rates: mean 20.0%, "
        "max 30.0% over 2 rows; whole systems: mean 50.0%, max 50.0% over 1 rows"
    )


def test_the_command_ends_with_the_error_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fidelity", "--only", "[16, 16] x [16"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    # 409 against 402 cycles: 1.7%.
    expected = "mean 1.7%, max 1.7% over 1 rows"
    assert last == f"|error| {expected}; single ops, layers and rates: {expected}"


def test_the_docs_give_the_error_summary(rows: list[fidelity.Row]) -> None:
    text = " ".join(DOCS.read_text(encoding="utf-8").split())
    assert f"Over the table, {fidelity.error_summary(rows)}." in text

"""The ranking check: every model Graphcore published several configurations of is ordered by
ipujax as the hardware ordered it (the rows as docs/fidelity.md records them: no compile here;
tests/cli/test_fidelity.py holds the table to the code), Spearman's correlation by hand, and
`ipujax fidelity` printing each model's correlation before its closing |error| line."""

from __future__ import annotations

import pytest

from ipujax import fidelity
from ipujax.cli import main
from ipujax.fidelity_doc import doc_rows
from ipujax.fidelity_ranking import model_of, ranking_summary, rankings, ranks, spearman


def test_every_model_with_several_configurations_is_in_the_published_order() -> None:
    found = {r.model: r for r in rankings(doc_rows())}
    # At least the systems the issue names: ResNet-50 on an MK2 Pod16 and Bow Pod16, Pod64
    # and Pod256; BERT-Large on Bow Pod16 and Pod64; and the AMP vertex's four sizes.
    assert len(found["ResNet-50 training throughput (images/s)"].names) >= 4
    assert len(found["BERT-Large pretraining phase 1 (seq 128) (sequences/s)"].names) >= 2
    assert len(found["AMP vertex (cycles)"].names) >= 4
    wrong = {m: (r.published, r.predicted) for m, r in found.items() if not r.in_order}
    assert not wrong, wrong
    assert all(r.correlation == 1.0 for r in found.values())


def test_models_by_name() -> None:
    by_name = {f.name: model_of(f) for f in fidelity.FIGURES}
    assert by_name["ResNet-50 training throughput, fp16, Bow Pod64 (64 replicas)"] == (
        "ResNet-50 training throughput (images/s)"
    )
    dense = "Keras Dense 4,096 -> 1,024, fp32, batch 16, MK2"
    assert by_name[dense] == "Keras Dense 4,096 -> 1,024 (cycles)"
    # The layer's memory and its vertex code are two quantities, neither a configuration.
    assert by_name[f"{dense}: vertex code"] == "Keras Dense 4,096 -> 1,024: vertex code (bytes)"


def test_spearman_by_hand() -> None:
    # Ranks 1, 2, 3 against 1, 3, 2: d = 0, 1, 1, so 1 - 6 x 2 / (3 x (9 - 1)) = 0.5.
    assert spearman([10, 20, 30], [5, 9, 7]) == pytest.approx(0.5)
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    # Ties share their ranks' mean: 5 and 5 take ranks 2 and 3, so 2.5 each.
    assert ranks([5, 5, 1]) == [2.5, 2.5, 1.0]
    with pytest.raises(ValueError, match="length >= 2"):
        spearman([1], [1])


def _figure(name: str, published: float, ipujax: float) -> fidelity.Figure:
    return fidelity.Figure(name, published, "cycles", "s", lambda: ipujax, "w")


def test_the_command_prints_the_rank_correlation(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    figures = (
        _figure("Toy, small", 100, 110),
        _figure("Toy, medium", 200, 240),
        _figure("Toy, large", 220, 200),  # ipujax ranks it below the medium: 1, 3, 2
        _figure("Other, only", 50, 50),
    )
    monkeypatch.setattr(fidelity, "FIGURES", figures)
    assert main(["fidelity"]) == 0
    *_, ranking, last = capsys.readouterr().out.strip().splitlines()
    assert ranking == (
        "rank correlation (Spearman) of each model's configurations: Toy (cycles) 0.50 over 3 "
        "(out of the published order)"
    )
    assert last.startswith("|error| mean")
    assert ranking_summary(fidelity.run(figures[3:])) == (
        "rank correlation (Spearman): no model with several configurations"
    )

"""The memory rows of the fidelity table: each published Poplar memory figure is rebuilt,
computes, and lies in the 0.75-1.33x band; and ipujax's total is the sum of its categories, as
PopVision's "total memory excluding gaps" is."""

from __future__ import annotations

import pytest

from ipujax import fidelity, fidelity_memory

MEMORY = [f for f in fidelity.FIGURES if f.kind == fidelity.MEMORY]


def test_every_memory_figure_is_a_row_of_the_table() -> None:
    assert [f.name for f in MEMORY] == [m.name for m in fidelity_memory.MEMORY_FIGURES]
    assert len(MEMORY) >= 2
    assert all(f.band == (fidelity.LOW, fidelity.HIGH) and f.unit == "bytes" for f in MEMORY)


@pytest.mark.parametrize("figure", MEMORY, ids=lambda f: f.name.split(",")[0])
def test_the_memory_figure_is_within_the_band(figure: fidelity.Figure) -> None:
    (row,) = fidelity.run([figure])
    assert row.within, (figure.name, round(row.ratio, 3))
    assert row.derivation and figure.source and figure.what


def test_the_total_is_the_categories_summed() -> None:
    report = fidelity_memory._dense()
    categories = dict(report.memory_categories)
    assert fidelity_memory.total_bytes(report) == sum(categories.values())
    # The layer's x, w and b are its inputs: always-live, at least their bytes.
    assert categories["variables_always_live"] >= 4 * (16 * 4096 + 4096 * 1024 + 1024)
    assert report.tile_memory.sum() == sum(categories.values())

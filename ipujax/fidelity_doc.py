"""The fidelity rows as docs/fidelity.md last recorded them: `ipujax fidelity --markdown` writes
the table, and what is derived from the rows without compiling them again (the error bands of
`ipujax.band_evidence`, the ranking check's tests) reads it back here.

A figure of `ipujax.fidelity.FIGURES` the table does not name yet (a row added since the table
was written) is left out: `ipujax fidelity --markdown docs/fidelity.md` brings it in.
"""

from __future__ import annotations

from pathlib import Path

from ipujax.fidelity import FIGURES, Figure, Row

DOCS = Path(__file__).resolve().parents[1] / "docs" / "fidelity.md"


def doc_rows(path: Path = DOCS, figures: tuple[Figure, ...] = FIGURES) -> list[Row]:
    """The rows of the table at `path`, each paired with its figure, in the figures' order."""
    values = doc_values(path.read_text(encoding="utf-8"))
    return [Row(f, values[f.name]) for f in figures if f.name in values]


def doc_values(text: str) -> dict[str, float]:
    """Each row's ipujax value, by figure name, from the markdown table."""
    values = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if not line.startswith("| ") or cells[0] == "figure" or len(cells) < 4:
            continue
        values[cells[0]] = _number(cells[2])
    return values


def _number(cell: str) -> float:
    """'25,700 images/s' -> 25700.0: the value before its unit, as `fidelity.number` wrote it."""
    value, _, _unit = cell.partition(" ")
    return float(value.replace(",", ""))

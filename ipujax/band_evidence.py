"""Each cost term's error band, from the fidelity rows that check it: which rows exercise which
term, and the band their errors give. `python -m ipujax.band_evidence` writes the table to
`ipujax/band_table.py` from docs/fidelity.md (the rows as `ipujax fidelity --markdown` last
recorded them), so a report reads its bands without compiling a row (`ipujax.bands`).

A row's error, as a factor on time: the published time over ipujax's (`ratio` for a rate such as
images/s, `1 / ratio` for cycles or bytes). A term's band is the largest such factor either way
over its rows, in log terms, made symmetric: (exp(-e), exp(e)) with e = max |ln factor|, so every
row that backs the term lies inside it. A term takes the finest rows that check it: single ops
and layers where any do; else the whole systems that run it; else no row does, and its band is
the default, the loosest band any row is held to (a whole system's, 0.5-1.5), taken both ways.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ipujax import terms as t
from ipujax.fidelity import FIGURES, MEMORY, OPS, SYSTEMS, Figure, Row
from ipujax.fidelity_doc import doc_rows
from partitioner import IPUS_PER_MACHINE, IPUS_PER_POD64

TABLE = Path(__file__).resolve().parent / "band_table.py"
SINGLE_OPS, WHOLE_SYSTEMS, DEFAULT = "single ops", "whole systems", "default: no row checks it"

# A row's figure against time: a rate's ratio is the published time over ipujax's; a duration's
# or a size's is its inverse. A figure in another unit (a ratio of two predictions) backs none.
RATE, DURATION = "rate", "duration"
UNIT_SENSE = {
    "cycles": DURATION,
    "bytes": DURATION,
    "images/s": RATE,
    "sequences/s": RATE,
    "TFLOPS": RATE,
}

IPUS_PER_POD16 = 16


def _level(ipus: int) -> str:
    """The collectives' term of a group over `ipus` IPUs of a system packed in that order."""
    if ipus <= IPUS_PER_MACHINE:
        return t.MACHINE
    if ipus <= IPUS_PER_POD16:
        return t.POD16
    return t.POD64 if ipus <= IPUS_PER_POD64 else t.ACROSS_POD64S


def _collectives(figure: Figure) -> tuple[str, ...]:
    return (_level(figure.ipus),)


# A single op's or layer's row checks the terms its quantity holds: words of its name or of what
# ipujax reads (lower case) -> the terms, or a function of the figure for the collectives' level.
OP_WORDS: tuple[tuple[str, tuple[str, ...] | Callable[[Figure], tuple[str, ...]]], ...] = (
    ("matmul", (t.MATMUL,)),
    ("supersteps", (t.MATMUL, t.VECTOR, t.EXCHANGE, t.SYNC)),  # a layer's steps, all they cost
    ("vector", (t.VECTOR,)),
    ("elementwise", (t.VECTOR,)),
    ("reduc", (t.VECTOR,)),
    ("copy", (t.COPIES,)),
    ("exchange", (t.EXCHANGE,)),
    ("sync", (t.SYNC,)),
    ("halo", (t.HALOS,)),
    ("allreduce", _collectives),
    ("all-reduce", _collectives),
    ("reducescatter", _collectives),
    ("allgather", _collectives),
    ("collective", _collectives),
    ("stream", (t.STREAMING,)),
    ("host", (t.HOST,)),
    ("loop", (t.VECTOR, t.EXCHANGE, t.SYNC)),
)

# What every whole system's step runs on its IPUs.
ON_CHIP = (t.MATMUL, t.VECTOR, t.COPIES, t.EXCHANGE, t.SYNC)


def exercised(figure: Figure) -> tuple[str, ...]:
    """The terms `figure`'s quantity depends on; none for a figure without a sense of time."""
    if figure.kind == MEMORY:
        return (t.MEMORY,)
    if UNIT_SENSE.get(figure.unit) is None:
        return ()
    if figure.kind == SYSTEMS:
        return _system_terms(figure)
    text = f"{figure.name} {figure.what}".lower()
    found: list[str] = []
    for word, made in OP_WORDS:
        if word in text:
            found += made(figure) if callable(made) else made
    return tuple(dict.fromkeys(found))


def _system_terms(figure: Figure) -> tuple[str, ...]:
    """A whole system: the step as a whole, its on-chip terms and, on several IPUs, its
    collectives' level; a pipeline's sends and (its optimizer state off chip) streaming, else
    the host's transfers (which a pipeline prefetches, and synthetic data does not make)."""
    text = f"{figure.name} {figure.what} {figure.source}".lower()
    links = (_level(figure.ipus),) if figure.ipus > 1 else ()
    if "pipeline" in text:
        streamed = (t.STREAMING,) if "off chip" in text or "stream" in text else ()
        extra = (t.SENDS, *streamed)
    else:
        extra = () if "synthetic" in text else (t.HOST,)
    return (t.SYSTEM, *ON_CHIP, *links, *extra)


def time_factor(row: Row) -> float:
    """The published time (or size) over ipujax's."""
    return row.ratio if UNIT_SENSE[row.figure.unit] == RATE else 1 / row.ratio


def default_band(figures: Sequence[Figure] = FIGURES) -> tuple[float, float]:
    """The loosest band a row is held to, taken both ways in log terms."""
    e = max(abs(math.log(bound)) for f in figures for bound in f.band)
    return _rounded(e)


def _rounded(e: float) -> tuple[float, float]:
    """(exp(-e), exp(e)) to 4 decimals, widened: every row stays inside."""
    return math.floor(math.exp(-e) * 1e4) / 1e4, math.ceil(math.exp(e) * 1e4) / 1e4


Entry = tuple[float, float, str, tuple[str, ...]]  # low, high, evidence, the rows' figures


def band_table(rows: Sequence[Row]) -> dict[str, Entry]:
    """Every term's band and the rows behind it."""
    backing = {term: _backing(term, rows) for term in (*t.TIME_TERMS, t.MEMORY, t.SYSTEM)}
    parts = [backing[p] for p in (t.MATMUL, t.VECTOR, t.COPIES)]
    # A pipeline's stages run matmul and vector vertices and copies, in shares no record keeps.
    backing[t.STAGES] = (
        " and ".join(dict.fromkeys(p[0] for p in parts)),
        [r for p in parts for r in p[1]],
    )
    fallback = default_band([r.figure for r in rows] or FIGURES)
    return {term: _entry(evidence, found, fallback) for term, (evidence, found) in backing.items()}


def _backing(term: str, rows: Sequence[Row]) -> tuple[str, list[Row]]:
    exercising = [r for r in rows if term in exercised(r.figure)]
    ops = [r for r in exercising if r.figure.kind in (OPS, MEMORY)]
    if ops:
        return SINGLE_OPS, ops
    systems = [r for r in exercising if r.figure.kind == SYSTEMS]
    return (WHOLE_SYSTEMS, systems) if systems else (DEFAULT, [])


def _entry(evidence: str, rows: list[Row], fallback: tuple[float, float]) -> Entry:
    if not rows:
        return (*fallback, DEFAULT, ())
    e = max(abs(math.log(time_factor(r))) for r in rows)
    names = tuple(dict.fromkeys(r.figure.name for r in rows))
    return (*_rounded(e), evidence, names)


def unused(rows: Sequence[Row]) -> tuple[str, ...]:
    """The rows that back no term, by name."""
    return tuple(r.figure.name for r in rows if not exercised(r.figure))


def source(rows: Sequence[Row]) -> str:
    """ipujax/band_table.py's text for `rows`."""
    entries = "".join(
        f"    {term!r}: (\n        {low!r},\n        {high!r},\n        {evidence!r},\n"
        f"        ({''.join(f'{chr(10)}            {n!r},' for n in names)}\n        ),\n    ),\n"
        for term, (low, high, evidence, names) in band_table(rows).items()
    )
    skipped = "".join(f"\n    {n!r}," for n in unused(rows))
    return _TEMPLATE.format(entries=entries, unused=skipped)


_TEMPLATE = '''"""The cost terms' error bands, which `ipujax.bands` applies: generated by
`python -m ipujax.band_evidence` from docs/fidelity.md; do not edit by hand.

term: (low, high, evidence, the fidelity rows that back it), the published time over ipujax's.
"""

# ruff: noqa: E501

BANDS: dict[str, tuple[float, float, str, tuple[str, ...]]] = {{
{entries}}}

# The rows that back no term: a figure with no sense of time (a ratio of two predictions), or
# a single op that no word of `band_evidence.OP_WORDS` names.
UNUSED: tuple[str, ...] = ({unused}
)
'''


def main() -> None:
    """Write the table, formatted as the project formats its code (ruff, a dev dependency)."""
    rows = doc_rows()
    TABLE.write_text(source(rows), encoding="utf-8")
    subprocess.run([sys.executable, "-m", "ruff", "format", "-q", str(TABLE)], check=True)
    print(f"wrote {TABLE} from {len(rows)} rows of docs/fidelity.md")


if __name__ == "__main__":
    main()

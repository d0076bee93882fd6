"""How far a report's time can be trusted: each cost term's error band, as the fidelity rows
that check it measured (`ipujax/band_table.py`, written by `ipujax.band_evidence`), combined
over the step's terms into `CostReport.seconds_range`.

The step's seconds split into terms (`ipujax.terms`); each term's seconds, times its band's low
and high factors, add up to the range, as if every term erred the same way at once (the
bound, not a likely spread). A step on several IPUs is at least as uncertain as the whole
systems the table checks (their rows measure how the terms combine on a system), so its
range spans at least their band. The range always holds the prediction itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ipujax import terms as t
from ipujax.band_table import BANDS
from ipujax.bottlenecks import bounds

if TYPE_CHECKING:
    from ipujax.report import CostReport

DEFAULT_EVIDENCE = "default: no row checks it"  # `band_evidence.DEFAULT`


@dataclass(frozen=True, slots=True)
class Band:
    """A term's error: the published time over ipujax's lies in [low, high] for every row
    that backs it (`rows`, figures of docs/fidelity.md); none for a default band."""

    term: str
    low: float
    high: float
    evidence: str
    rows: tuple[str, ...]

    @property
    def default(self) -> bool:
        return not self.rows

    def text(self) -> str:
        """'0.87-1.14x (single ops: 7 rows)'."""
        why = self.evidence if self.default else f"{self.evidence}: {len(self.rows)} rows"
        return f"{self.low:.2f}-{self.high:.2f}x ({why})"


def band(term: str) -> Band:
    low, high, evidence, rows = BANDS[term]
    return Band(term, low, high, evidence, rows)


@dataclass(frozen=True, slots=True)
class TermTime:
    """A term's seconds in the step and its band."""

    band: Band
    seconds: float


def term_times(report: CostReport) -> list[TermTime]:
    """The step's terms with their seconds, in `terms.TIME_TERMS` order."""
    cycles = t.term_cycles(report.supersteps, report.collectives)
    return [TermTime(band(term), c / report.clock_hz) for term, c in cycles.items()]


def report_seconds_range(report: CostReport) -> tuple[float, float]:
    """(low, high) around `report.seconds`: low <= seconds <= high."""
    return time_range(term_times(report), report.seconds, report.ipus)


def time_range(times: Sequence[TermTime], seconds: float, ipus: int) -> tuple[float, float]:
    """The terms' bands weighted by their seconds, scaled to the step's `seconds` (its terms
    add up to it), widened on a system to the whole systems' band, and holding `seconds`."""
    total = sum(x.seconds for x in times)
    if total <= 0:
        return seconds, seconds
    low = sum(x.seconds * x.band.low for x in times) / total
    high = sum(x.seconds * x.band.high for x in times) / total
    if ipus > 1:
        system = band(t.SYSTEM)
        low, high = min(low, system.low), max(high, system.high)
    return min(seconds * low, seconds), max(seconds * high, seconds)


def derived_fields(report: CostReport) -> dict[str, list]:
    """What the JSON report adds to its fields, derived and not read back: the time's range
    and each superstep's bound (`ipujax.bottlenecks`)."""
    return {"seconds_range": list(report.seconds_range), "bounds": list(bounds(report.supersteps))}


def memory_range(peak_bytes: int) -> tuple[int, int]:
    """A tile's peak bytes as the memory rows bound them."""
    memory = band(t.MEMORY)
    # Rounded first: 100,000 x 1.3096 is 130,960.00000000001 in floats.
    low, high = round(peak_bytes * memory.low, 6), round(peak_bytes * memory.high, 6)
    return math.floor(low), math.ceil(high)


def range_text(report: CostReport) -> str:
    """'1.23-1.61 ms (0.82-1.23x, by the fidelity rows' errors per cost term)'."""
    low, high = report.seconds_range
    seconds = report.seconds or 1
    return (
        f"{_ms(low)}-{_ms(high)} ms ({low / seconds:.2f}-{high / seconds:.2f}x, by the "
        "fidelity rows' errors per cost term)"
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4f}"

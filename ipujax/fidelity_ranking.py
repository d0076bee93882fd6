"""The ranking check: where Graphcore published several configurations of one model (systems,
batch sizes, training or inference), does ipujax order them as the hardware did? A plan
search is only as good as its order, so the fidelity table's rows are grouped by model and
each group's Spearman rank correlation between published and predicted figures is reported
(`ipujax fidelity`, docs/fidelity.md); tests/ipujax/test_ranking_fidelity.py holds every
group to the published order.

A row's model is its name up to the first ', ' (the rest is its configuration), with what it
measures (the name's part after ': ', if any) and its unit: the same quantity of one model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ipujax.fidelity import Figure, Row


def model_of(figure: Figure) -> str:
    """'ResNet-50 training throughput (images/s)': the model, what is measured, the unit."""
    name, _, quantity = figure.name.partition(": ")
    model = name.split(", ")[0]
    return f"{model}{f': {quantity}' if quantity else ''} ({figure.unit})"


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of theirs."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in order[i : j + 1]:
            out[k] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's over the ranks (1.0 when both are constant)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"spearman needs two sequences of one length >= 2, got {len(a)}, {len(b)}")
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    if va == 0 or vb == 0:
        return 1.0 if va == vb else 0.0
    return cov / (va * vb) ** 0.5


@dataclass(frozen=True, slots=True)
class Ranking:
    """One model's published configurations and ipujax's figures for them."""

    model: str
    names: tuple[str, ...]
    published: tuple[float, ...]
    predicted: tuple[float, ...]

    @property
    def correlation(self) -> float:
        return spearman(self.published, self.predicted)

    @property
    def in_order(self) -> bool:
        """ipujax ranks every configuration where the published figures do."""
        return ranks(self.published) == ranks(self.predicted)


def rankings(rows: Sequence[Row]) -> list[Ranking]:
    """Every model with several configurations among `rows`, in the rows' order."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(model_of(row.figure), []).append(row)
    return [
        Ranking(
            model,
            tuple(r.figure.name for r in group),
            tuple(r.figure.published for r in group),
            tuple(r.ipujax for r in group),
        )
        for model, group in groups.items()
        if len(group) > 1
    ]


def ranking_summary(rows: Sequence[Row]) -> str:
    """One line: each model's Spearman correlation and how many configurations it has."""
    found = rankings(rows)
    if not found:
        return "rank correlation (Spearman): no model with several configurations"
    parts = [
        f"{r.model} {r.correlation:.2f} over {len(r.names)}"
        + ("" if r.in_order else " (out of the published order)")
        for r in found
    ]
    return "rank correlation (Spearman) of each model's configurations: " + "; ".join(parts)

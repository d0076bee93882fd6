"""The factor record every factor rule returns (`factor_rules`, `conv_factors`): which factor
each dimension of an op's operands and results maps to, the factors' sizes, which of them are
reductions, and the projection of factor axes back onto a tensor's dims."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from lowering import Op
from partitioner.sharding.specs import Axes, Sharding

Dims = tuple[int | None, ...]


@dataclass(frozen=True, slots=True)
class Factors:
    """An op's factors. A dim maps to one factor (or None: whole on every IPU). A dim may be a
    multiple of its factor's size (a grouped convolution's channels, `groups` x channels per
    group): splitting the factor then splits the dim into blocks of whole units."""

    operands: tuple[Dims, ...]
    results: tuple[Dims, ...]
    sizes: tuple[int, ...]
    reduction: frozenset[int] = field(default_factory=frozenset)
    rule: str = ""


FactorRule = Callable[[Op], Factors]


def project(dims: Dims, axes: tuple[Axes, ...], partial: Axes = ()) -> Sharding:
    """The sharding of a tensor whose dims map to factors `dims`, each factor split over
    `axes[factor]` (a dim mapped to no factor stays whole)."""
    return Sharding(tuple(() if f is None else axes[f] for f in dims), partial)

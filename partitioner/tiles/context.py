"""What tile rules share while the scheduler maps one program: the target, the tile offset that
spreads linearly mapped tensors over the chip, and the op that makes each value."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lowering import Graph, Op, Value
from partitioner.cost.links import LinkModel
from partitioner.layout import Layout, linear_layout
from partitioner.program import Program
from partitioner.target import Target

# Schedules a region (a loop's body, a branch) with its inputs and captures in given layouts;
# the scheduler lends it to the rules of ops with regions.
RegionScheduler = Callable[[Graph, Mapping[Value, Layout]], Program]


@dataclass
class MappingContext:
    target: Target
    constants: dict[Value, np.ndarray] = field(default_factory=dict)
    links: LinkModel | None = None
    producers: dict[Value, Op] = field(default_factory=dict)  # value -> the op that makes it
    region_scheduler: RegionScheduler | None = None
    _next_start: int = 0
    _held_start: int | None = None  # inside `one_place`: where every `spread` starts
    placed: int = 0  # how often a rule asked where to place a tensor (`linear`, `spread`)
    # `linear`'s layouts by shape, item size and start: GPT-3's 24k linear tensors (19.6k of
    # them constants) take a few thousand distinct layouts.
    _linear: dict[tuple[tuple[int, ...], int, int], Layout] = field(default_factory=dict)

    def linear(self, value: Value) -> Layout:
        """A linear layout for a value, starting where the last small tensor stopped, so that
        many small tensors do not all land on tile 0."""
        t = self.target
        self.placed += 1
        key = (value.shape, value.dtype.itemsize, self._next_start)
        layout = self._linear.get(key)
        if layout is None:
            layout = self._linear[key] = linear_layout(
                value.shape,
                value.dtype.itemsize,
                t.tiles_per_ipu,
                grain_bytes=t.grain_bytes,
                min_bytes=t.min_bytes_per_tile,
                start=self._next_start,
            )
        self._next_start = layout.stop % t.tiles_per_ipu
        return layout

    def spread(self, tiles: int) -> int:
        """The first of `tiles` tiles for a small result a rule places itself (a reduction's),
        where the last small tensor stopped, as `linear` places them."""
        count = self.target.tiles_per_ipu
        self.placed += 1
        at = self._next_start if self._held_start is None else self._held_start
        start = at if at + tiles <= count else 0
        self._next_start = (start + tiles) % count
        return start

    @contextlib.contextmanager
    def one_place(self) -> Iterator[None]:
        """Within the block, every small result a rule places itself (`spread`) starts on the
        same tile: sibling reductions' outputs share their tiles, as the several outputs of one
        reduction do."""
        self._held_start = self._next_start
        try:
            yield
        finally:
            self._held_start = None

    @property
    def next_place(self) -> tuple[int, int | None]:
        """Where the next small tensor goes: the tile after the last one, and inside
        `one_place` the tile every `spread` starts on."""
        return self._next_start, self._held_start

    def place_next_at(self, start: int) -> None:
        """`linear` and `spread` go on from `start` (where a copy of a task left them,
        `repeats`)."""
        self._next_start = start

    def schedule_region(self, region: Graph, given: Mapping[Value, Layout]) -> Program:
        if self.region_scheduler is None:
            raise ValueError("this context schedules no regions")
        return self.region_scheduler(region, given)

    def constant_of(self, value: Value) -> Any:
        return self.constants.get(value)

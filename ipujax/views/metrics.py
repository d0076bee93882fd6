"""Figures derived from a `CostReport` that every view shows: the tables, the HTML page and the
report comparison all call these, so that they agree to the cycle.

Nothing here reads more than the report holds; docs/cli.md defines each figure.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ipujax.report import CostReport, PhaseCost, TileUsage, popvision_name
from lowering import shorten_paths
from partitioner import pipeline_slots

# ---- formatting ------------------------------------------------------------------------------


def fmt_int(n: int | float) -> str:
    return f"{int(n):,}"


def fmt_bytes(n: int | float) -> str:
    """Exact bytes with a readable unit: '34,632 B (33.8 KiB)'."""
    n = int(n)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n:,} B ({n / size:.1f} {unit})"
    return f"{n:,} B"


def fmt_bytes_short(n: int | float) -> str:
    """Bytes in a unit only, for axis labels and tight columns: '33.8 KiB'."""
    n = float(n)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_seconds(seconds: float) -> str:
    """A duration in the unit that reads best: '157.4 µs', '3.21 ms', '1.50 s'."""
    if seconds >= 1:
        return f"{seconds:.3g} s" if seconds < 100 else f"{seconds:,.0f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.4g} ms"
    if seconds >= 1e-6:
        return f"{seconds * 1e6:.4g} µs"
    return f"{seconds * 1e9:.4g} ns"


def fmt_pct(fraction: float, digits: int = 2) -> str:
    return f"{100 * fraction:.{digits}f}%"


def fmt_delta(a: float, b: float, *, as_bytes: bool = False) -> tuple[str, str]:
    """The change from a to b, absolute and relative: ('+1,024', '+12.5%')."""
    delta = b - a
    if not delta:
        return "0", "0%"
    if isinstance(a, float) or isinstance(b, float):
        absolute = f"{delta:+.4g}"
    else:
        absolute = f"{int(delta):+,}"
    if as_bytes and delta:
        absolute += f" ({'+' if delta > 0 else '-'}{fmt_bytes_short(abs(delta))})"
    relative = "new" if a == 0 else f"{100 * delta / abs(a):+.2f}%"
    return absolute, relative


def short_source(source: str) -> str:
    """'file:line' with the file as a person names it (`lowering.shorten_paths`)."""
    return shorten_paths(source) if source else "(no source line)"


# ---- execution -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Kinds:
    """Cycles summed by what a superstep spends them on (PopVision's step kinds)."""

    compute: int  # compute sets that compute (vertices of arithmetic)
    exchange: int
    sync: int
    link: int = 0  # collectives' rings over the IPU-Links
    stream: int = 0  # streaming memory that compute does not hide (phased programs)
    host: int = 0  # transfers from and to the host that compute does not hide
    copies: int = 0  # compute sets that only move data on tiles (copies, transposes, slices)

    @property
    def total(self) -> int:
        return sum(cycles for _, _, cycles in self.rows())

    def rows(self) -> tuple[tuple[str, str, int], ...]:
        """(kind, PopVision step, cycles) in the order the tables list them."""
        return (
            ("compute", "OnTileExecute", self.compute),
            ("on-tile copies", "OnTileExecute (copies)", self.copies),
            ("exchange", "DoExchange", self.exchange),
            ("sync", "Sync", self.sync),
            ("IPU-Links", "GlobalExchange", self.link),
            ("streaming", "StreamCopy", self.stream),
            ("host", "StreamCopy (host)", self.host),
        )


PHASE_COLUMNS = (
    "phase",
    "cycles",
    "compute",
    "streaming",
    "exposed",
    "loads",
    "stores",
    "gathered",
    "kept on chip",
    "peak tile bytes",
)


def phase_figures(p: PhaseCost) -> tuple[int, ...]:
    """A phase's figures in the order of `PHASE_COLUMNS` after its name."""
    exposed = p.stream_cycles - p.overlapped_cycles
    return (
        p.cycles,
        p.compute_cycles,
        p.stream_cycles,
        exposed,
        p.load_bytes,
        p.store_bytes,
        p.link_bytes,
        p.kept_bytes,
        p.peak_tile_bytes,
    )


def kind_totals(report: CostReport) -> Kinds:
    steps = report.supersteps
    return Kinds(
        compute=sum(s.compute_cycles for s in steps if s.kind != "copy"),
        copies=sum(s.compute_cycles for s in steps if s.kind == "copy"),
        exchange=sum(s.exchange_cycles for s in steps),
        sync=sum(s.sync_cycles for s in steps),
        link=sum(s.link_cycles for s in steps if s.kind not in ("stream", "host")),
        stream=sum(s.link_cycles for s in steps if s.kind == "stream"),
        host=sum(s.link_cycles for s in steps if s.kind == "host"),
    )


@dataclass(frozen=True, slots=True)
class OpCost:
    """The supersteps of one op (and, when grouped so, one source line), summed."""

    op: str
    source: str
    steps: int
    compute: int
    exchange: int
    sync: int
    flops: int
    exchange_bytes: int
    link: int = 0

    @property
    def cycles(self) -> int:
        return self.compute + self.exchange + self.sync + self.link


def _group(report: CostReport, with_source: bool) -> list[OpCost]:
    groups: dict[tuple[str, str], list[int]] = {}
    for s in report.supersteps:
        key = (s.op, s.source if with_source else "")
        totals = groups.setdefault(key, [0] * 7)
        values = (
            1,
            s.compute_cycles,
            s.exchange_cycles,
            s.sync_cycles,
            s.flops,
            s.exchange_bytes,
            s.link_cycles,
        )
        for i, value in enumerate(values):
            totals[i] += value
    costs = [OpCost(op, source, *totals) for (op, source), totals in groups.items()]
    return sorted(costs, key=lambda c: (-c.cycles, c.op, c.source))


def sum_costs(op: str, costs: list[OpCost]) -> OpCost:
    """Several groups as one row ('... 12 more')."""
    return OpCost(
        op,
        "",
        sum(c.steps for c in costs),
        sum(c.compute for c in costs),
        sum(c.exchange for c in costs),
        sum(c.sync for c in costs),
        sum(c.flops for c in costs),
        sum(c.exchange_bytes for c in costs),
        sum(c.link for c in costs),
    )


def by_op_and_source(report: CostReport) -> list[OpCost]:
    """Cycles by (op, source line), costliest first."""
    return _group(report, with_source=True)


def by_op(report: CostReport) -> list[OpCost]:
    """Cycles by op over all its source lines, costliest first."""
    return _group(report, with_source=False)


@dataclass(frozen=True, slots=True)
class CollectiveGroup:
    """Collectives of one kind over the same axes needed at one source line."""

    kind: str
    axes: tuple[str, ...]
    group_size: int
    source: str
    count: int
    bytes_per_ipu: int
    cycles: int


def collective_groups(report: CostReport) -> list[CollectiveGroup]:
    """The report's collectives grouped by kind, axes and source line, costliest first."""
    groups: dict[tuple, list] = {}
    for c in report.collectives:
        groups.setdefault((c.kind, c.axes, c.group_size, c.source), []).append(c)
    found = [
        CollectiveGroup(
            kind=key[0],
            axes=key[1],
            group_size=key[2],
            source=key[3],
            count=len(members),
            bytes_per_ipu=sum(c.bytes_per_ipu for c in members),
            cycles=sum(c.cycles for c in members),
        )
        for key, members in groups.items()
    ]
    return sorted(found, key=lambda g: (-g.cycles, g.source))


def tile_balance(report: CostReport) -> float:
    """Σ_steps(compute_cycles * tiles_used) / (Σ_steps compute_cycles * tiles_per_ipu): the share
    of the IPU's tile-cycles of compute in which a tile has work (1.0: every tile, every step)."""
    compute = sum(s.compute_cycles for s in report.supersteps)
    if not compute or not report.tiles_per_ipu:
        return 0.0
    used = sum(s.compute_cycles * s.tiles for s in report.supersteps)
    return used / (compute * report.tiles_per_ipu)


def peak_flops_per_second(report: CostReport) -> float:
    """The whole system's peak rate at the program's matmul precision."""
    return report.peak_flops_per_cycle * report.tiles_per_ipu * report.ipus * report.clock_hz


# ---- memory ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IpuMemory:
    ipu: int
    peak: int
    peak_tile: int
    total: int
    mean: float
    always_live: int  # summed over tiles
    not_always_live: int  # tile_memory - always_live: not-always-live bytes and code
    always_live_max: int  # on the tile that holds the most
    not_always_live_max: int
    peak_tile_always_live: int  # the split on the fullest tile
    over_budget_tiles: int

    def liveness_rows(self) -> tuple[tuple[str, str, str, str], ...]:
        """(kind, all tiles, the fullest tile of this kind, on the peak tile): always-live
        bytes, then the rest."""
        return (
            (
                "always-live (inputs, constants)",
                fmt_bytes(self.always_live),
                fmt_bytes(self.always_live_max),
                fmt_bytes(self.peak_tile_always_live),
            ),
            (
                "not-always-live + code (the rest)",
                fmt_bytes(self.not_always_live),
                fmt_bytes(self.not_always_live_max),
                fmt_bytes(self.peak - self.peak_tile_always_live),
            ),
        )


def ipu_groups(report: CostReport) -> list[tuple[str, IpuMemory]]:
    """IPUs whose tiles hold the same bytes, as one row each: ('0-3', memory of IPU 0). Every
    IPU of an SPMD program holds the same, so a mesh of 64 IPUs prints as one row."""
    rows: list[tuple[list[int], IpuMemory]] = []
    for memory in ipu_memory(report):
        i = memory.ipu
        for ipus, first in rows:
            j = first.ipu
            if np.array_equal(report.tile_memory[i], report.tile_memory[j]) and np.array_equal(
                report.always_live[i], report.always_live[j]
            ):
                ipus.append(i)
                break
        else:
            rows.append(([i], memory))
    return [(ipu_range(ipus), memory) for ipus, memory in rows]


def ipu_range(ipus: list[int]) -> str:
    """[0, 1, 2, 3] -> '0-3'; [0, 2] -> '0, 2'."""
    if len(ipus) > 1 and ipus == list(range(ipus[0], ipus[-1] + 1)):
        return f"{ipus[0]}-{ipus[-1]}"
    return ", ".join(map(str, ipus))


def ipu_memory(report: CostReport) -> list[IpuMemory]:
    out = []
    for ipu in range(report.tile_memory.shape[0]):
        total = report.tile_memory[ipu]
        live = report.always_live[ipu]
        rest = total - live
        peak_tile = int(np.argmax(total)) if total.size else 0
        out.append(
            IpuMemory(
                ipu=ipu,
                peak=int(total.max()) if total.size else 0,
                peak_tile=peak_tile,
                total=int(total.sum()),
                mean=float(total.mean()) if total.size else 0.0,
                always_live=int(live.sum()),
                not_always_live=int(rest.sum()),
                always_live_max=int(live.max()) if live.size else 0,
                not_always_live_max=int(rest.max()) if rest.size else 0,
                peak_tile_always_live=int(live[peak_tile]) if live.size else 0,
                over_budget_tiles=int((total > report.bytes_per_tile).sum()),
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class Category:
    """One memory category as PopVision counts it: bytes on the fullest tile and over all the
    tiles of one IPU (every IPU alike)."""

    name: str
    popvision: str  # what libpva calls it
    tile_bytes: int
    ipu_bytes: int


def categories(report: CostReport) -> list[Category]:
    """The report's categories in its order; empty for reports older than version 3."""
    tile = dict(report.fullest_tile_categories)
    ipu = dict(report.memory_categories)
    names = dict.fromkeys([*tile, *ipu])
    return [Category(n, popvision_name(n), tile.get(n, 0), ipu.get(n, 0)) for n in names]


@dataclass(frozen=True, slots=True)
class Bin:
    low: int
    high: int  # inclusive
    count: int


def histogram(values: Iterable[int] | np.ndarray, bins: int = 10) -> list[Bin]:
    """Equal-width bins from the smallest to the largest value (one bin if all are equal)."""
    data = np.asarray(list(values) if not isinstance(values, np.ndarray) else values).ravel()
    if data.size == 0:
        return []
    low, high = int(data.min()), int(data.max())
    if low == high:
        return [Bin(low, high, int(data.size))]
    width = math.ceil((high - low + 1) / bins)
    edges = [low + i * width for i in range(bins + 1)]
    counts, _ = np.histogram(data, bins=edges)
    return [
        Bin(edges[i], min(edges[i + 1] - 1, high), int(c))
        for i, c in enumerate(counts)
        if edges[i] <= high
    ]


def repeated_tensors(report: CostReport) -> list[int | None]:
    """For each of `top_tiles`, the earlier tile whose largest tensors are the same (the views
    then say 'same as tile N' instead of repeating the list), or None."""
    seen: dict[tuple, int] = {}
    out: list[int | None] = []
    for usage in report.top_tiles:
        key = tuple(usage.tensors)
        out.append(seen.get(key) if key else None)
        seen.setdefault(key, usage.tile)
    return out


def largest_tensors(usage: TileUsage, same: int | None) -> tuple[tuple[int | str, str], ...]:
    """A fullest tile's largest tensors as (bytes, what) rows; one line when they are those of
    tile `same`, listed above it."""
    if same is not None:
        return (("", f"(the same largest tensors as tile {same})"),)
    return usage.tensors or ((0, "(none listed)"),)


def bin_labels(bins: list[Bin]) -> list[str]:
    """'16.0 KiB - 17.8 KiB' per bin; exact bytes when rounded units would not tell bins apart."""
    lows = {fmt_bytes_short(b.low) for b in bins}
    highs = {fmt_bytes_short(b.high) for b in bins}
    exact = len(lows) < len(bins) or len(highs) < len(bins)
    fmt = fmt_int if exact else fmt_bytes_short
    unit = " B" if exact else ""
    return [
        f"{fmt(b.low)}{unit}" if b.low == b.high else f"{fmt(b.low)} - {fmt(b.high)}{unit}"
        for b in bins
    ]


def byte_ticks(top: float, count: int = 4) -> tuple[list[float], float]:
    """Round axis ticks from 0 for bytes up to `top`: ([0, 8 KiB, 16 KiB, ...], axis end)."""
    unit = next((u for u in (1 << 30, 1 << 20, 1 << 10) if top >= u), 1)
    raw = max(top / unit / count, 1e-9)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(f * magnitude for f in (1, 2, 2.5, 5, 10) if f * magnitude >= raw) * unit
    ticks = [0.0]
    while ticks[-1] < top:
        ticks.append(ticks[-1] + step)
    return ticks, ticks[-1]


def nice_ticks(top: float, count: int = 6) -> list[float]:
    """Round ticks from 0 to at most `top`, about `count` of them: 0, 2.5, 5, 7.5, 10, ..."""
    if top <= 0:
        return [0.0]
    raw = top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(f * magnitude for f in (1, 2, 2.5, 5, 10) if f * magnitude >= raw)
    return [i * step for i in range(int(top / step + 1e-9) + 1)]


def memory_fraction(report: CostReport) -> float:
    return report.peak_tile_bytes / report.bytes_per_tile if report.bytes_per_tile else 0.0


# ---- pipeline ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PipelineBlock:
    """One stage's forward or backward of one micro-batch, where it falls in the step."""

    stage: int
    kind: str  # "forward" or "backward"
    microbatch: int
    cycle: int  # the pipeline cycle
    cycle_start: int  # cycles from the step's start to its pipeline cycle's
    start: int  # cycles from the step's start
    cycles: int


def pipeline_blocks(report: CostReport, max_cycles: int | None = None) -> list[PipelineBlock]:
    """The pipeline's timeline from the report: in each pipeline cycle each stage runs its
    forward then its backward (`partitioner.pipeline_slots` says of which micro-batches); the
    first and last `max_cycles // 2` cycles when given, else all."""
    count, n = len(report.stages), report.microbatches
    cycles = report.pipeline_cycles
    wanted: list[int] = list(range(len(cycles)))
    if max_cycles is not None and len(cycles) > max_cycles:
        half = max_cycles // 2
        wanted = [*range(half), *range(len(cycles) - half, len(cycles))]
    starts = list(itertools.accumulate(cycles, initial=0))
    out = []
    for t in wanted:
        for s in report.stages:
            forward, backward = pipeline_slots(s.stage, count, n, t)
            at = starts[t]
            if forward is not None:
                out.append(
                    PipelineBlock(s.stage, "forward", forward, t, starts[t], at, s.forward_cycles)
                )
                at += s.forward_cycles
            if backward is not None:
                out.append(
                    PipelineBlock(
                        s.stage, "backward", backward, t, starts[t], at, s.backward_cycles
                    )
                )
    return out

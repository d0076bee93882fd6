"""The cost report: what the real machine would do, from the Target's cost model.

Every figure here is derived statically when the program is compiled (cycles from the cost
formulas of `partitioner.cost`, bytes from layouts), never measured from the simulator. The
report holds the partitioner's records themselves, prints as text and round-trips exactly
through a versioned JSON schema (a record's figures are its fields that compare; where a
superstep runs on the chip is the schedule's business, not the report's).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from ipujax.bands import derived_fields, range_text, report_seconds_range
from ipujax.errors import ReportError
from ipujax.latency import CallLatency, call_latency
from ipujax.numerics import numerics_summary
from ipujax.report_io import io_caveats, io_tile_memory, with_io_tiles
from lowering import shorten_paths
from partitioner import (
    MEMORY_CATEGORIES,
    POPVISION_NAMES,
    Built,
    CollectiveCost,
    PhaseCost,
    Program,
    StageCost,
    Superstep,
    TileMemory,
    TileUsage,
    bubble_fraction,
    fullest_tiles,
    per_record,
)

SCHEMA = "ipujax.cost_report"
VERSION = 6  # 2: phases record their loads, stores and kept bytes; host bytes. 3: memory by
# PopVision category, per IPU and on each of the fullest tiles. 4: pipeline stages and cycles.
# 5: caveats, the assumptions a figure rests on (a loop's trips, the unroll limit). 6: numerics,
# device iterations and host latency; collectives' buffer bytes; derived time range and bounds
READABLE = (1, 2, 3, 4, 5, 6)  # older reports read with the fields they lack at their defaults


_R = TypeVar("_R")  # a record: SuperstepCost, CollectiveCost, TileUsage

# The report's records are the partitioner's own: a superstep of the schedule, a collective it
# carries, a phase, a tile at its peak. `SuperstepCost` is the report's name for a superstep.
SuperstepCost = Superstep


_RECORDS = {
    "supersteps": SuperstepCost,
    "collectives": CollectiveCost,
    "phases": PhaseCost,
    "top_tiles": TileUsage,
    "stages": StageCost,
}
_ARRAYS = ("tile_memory", "always_live")
# Fields older reports lack, read as their defaults (and `TileUsage.categories` as empty).
_LATER = (
    "host_bytes",
    "memory_categories",
    "stages",
    "microbatches",
    "pipeline_cycles",
    "caveats",
    "device_iterations",
    "host_latency_cycles",
    "numerics",
)


@dataclass(frozen=True, eq=False)
class CostReport:
    """What one step of the program costs on the virtual system. Every IPU runs the same
    per-IPU program, so cycles, FLOPs and on-chip exchange bytes are per IPU (each IPU's, all
    alike); IPU-Link and streaming bytes are the whole system's."""

    target: str
    system: str
    ipus: int
    tiles_per_ipu: int
    clock_hz: float
    bytes_per_tile: int
    total_cycles: int
    flops: int  # per IPU
    peak_flops_per_cycle: int  # per tile at the program's matmul precision, for utilisation
    exchange_bytes: int  # per IPU
    ipu_link_bytes: int  # all IPUs
    streaming_bytes: int  # all IPUs
    tile_memory: np.ndarray  # [ipus, tiles] peak bytes
    always_live: np.ndarray  # [ipus, tiles] always-live bytes
    supersteps: tuple[SuperstepCost, ...]
    collectives: tuple[CollectiveCost, ...] = ()
    phases: tuple[PhaseCost, ...] = ()
    top_tiles: tuple[TileUsage, ...] = ()
    host_bytes: int = 0  # all IPUs, to and from the host (version 2)
    # (category, bytes) over all tiles of one IPU, every IPU alike; the not-always-live
    # variables summed at each tile's own peak (version 3; `MEMORY_CATEGORIES` names them)
    memory_categories: tuple[tuple[str, int], ...] = ()
    # Pipelined (version 4): each stage on its IPUs, the micro-batches, and every pipeline
    # cycle's duration (the stages' slowest work, sends and sync); the update follows them
    stages: tuple[StageCost, ...] = ()
    microbatches: int = 0
    pipeline_cycles: tuple[int, ...] = ()
    # What the figures assume, one line each naming the user's line (version 5): a loop whose
    # trips only a run knows (one trip, or those the last run counted), one left whole at the
    # unroll limit
    caveats: tuple[str, ...] = ()
    # Calls per host transfer (`jit(device_iterations=...)`), each transfer's fixed cycles
    device_iterations: int = 1
    host_latency_cycles: int = 0
    numerics: str = "exact"  # or "ipu": float16 rounded stochastically (`ipujax.numerics`)

    @property
    def seconds(self) -> float:
        return self.total_cycles / self.clock_hz

    seconds_range = property(report_seconds_range)  # (low, high) around seconds: ipujax.bands

    @property
    def latency(self) -> CallLatency:
        """One call's host in, device and host out seconds, its latency and calls/s."""
        return call_latency(self)

    @property
    def peak_tile_bytes(self) -> int:
        return int(self.tile_memory.max()) if self.tile_memory.size else 0

    @property
    def fits(self) -> bool:
        return self.peak_tile_bytes <= self.bytes_per_tile

    @property
    def bubble_fraction(self) -> float:
        """Pipelined: the share of the stages' pipeline time they spend idle; else 0."""
        return bubble_fraction(self.stages, self.microbatches, sum(self.pipeline_cycles))

    @property
    def fullest_tile_categories(self) -> tuple[tuple[str, int], ...]:
        """The fullest tile's bytes by category; empty for reports older than version 3."""
        return self.top_tiles[0].categories if self.top_tiles else ()

    @property
    def system_flops(self) -> int:
        """FLOPs of all IPUs together in one step."""
        return self.flops * self.ipus

    @property
    def flop_utilisation(self) -> float:
        """FLOPs per IPU over what one IPU could do in the step's time: the same share for the
        whole system, every IPU doing alike."""
        peak = self.peak_flops_per_cycle * self.tiles_per_ipu * self.total_cycles
        return self.flops / peak if peak else 0.0

    def time_split(self) -> dict[str, float]:
        """The step's seconds by what they are spent on: compute sets, on-tile copies (layout
        changes: transposes, rearrangements, slices), on-chip exchange, syncs
        on one IPU, collectives over IPU-Links (their rings and group syncs), streaming memory
        and the host (what compute does not hide)."""
        kinds = {"collective": "collectives", "stream": "streaming", "host": "host"}
        split = dict.fromkeys(("compute", "copies", "exchange", "sync", *kinds.values()), 0)
        for s in self.supersteps:
            split["copies" if s.kind == "copy" else "compute"] += s.compute_cycles
            split["exchange"] += s.exchange_cycles
            split[kinds.get(s.kind, "sync")] += s.link_cycles + s.sync_cycles
        return {k: v / self.clock_hz for k, v in split.items()}

    # ---- text ------------------------------------------------------------------------------

    def summary(self) -> str:
        fits = "yes" if self.fits else "NO"
        lines = [
            f"target          {self.target} x {self.ipus} ({self.system}), "
            f"{self.tiles_per_ipu:,} tiles/IPU at {self.clock_hz / 1e9:.3f} GHz",
            f"total cycles    {self.total_cycles:,} ({self.seconds * 1e3:.4f} ms)",
            f"time range      {range_text(self)}",
            "time split      "
            + ", ".join(f"{k} {v * 1e3:.4f} ms" for k, v in self.time_split().items()),
            f"FLOPs per IPU   {self.flops:,} ({100 * self.flop_utilisation:.2f}% of peak); "
            f"system {self.system_flops:,}",
            f"peak tile mem   {self.peak_tile_bytes:,} of {self.bytes_per_tile:,} bytes, "
            f"fits: {fits}",
            *self._category_lines(),
            f"exchange        {self.exchange_bytes:,} bytes on chip per IPU",
            f"IPU-Links       {self.ipu_link_bytes:,} bytes; "
            f"streaming {self.streaming_bytes:,} bytes; host {self.host_bytes:,} bytes "
            "(all IPUs)",
            f"supersteps      {len(self.supersteps)}",
            *(
                f"collectives     {count} over {route}, {cycles / self.clock_hz * 1e3:.4f} ms"
                for route, count, cycles in self.collectives_by_route()
            ),
            *self._pipeline_lines(),
            f"per call        {self.latency.summary()}",
            f"numerics        {numerics_summary(self.numerics)}",
            *(f"caveat          {line}" for line in self.caveats),
        ]
        lines += ["", "cycles by op:"]
        lines += [f"  {cycles:>14,}  {op}" for op, cycles in self.cycles_by_op()[:10]]
        return "\n".join(lines)

    def collectives_by_route(self) -> list[tuple[str, int, int]]:
        """(route, how many, their cycles) of the step's collectives by the links they run
        over, most cycles first: a route such as "IPU-Links within a Pod64, then Gateway-Links
        between Pod64s" is a collective run level by level."""
        found: dict[str, list[int]] = {}
        for c in self.collectives:
            route = c.why.rsplit("; over ", 1)[-1] if "; over " in c.why else "links"
            found.setdefault(route, []).append(c.cycles)
        rows = [(route, len(cycles), sum(cycles)) for route, cycles in found.items()]
        return sorted(rows, key=lambda r: (-r[2], r[0]))

    def _pipeline_lines(self) -> list[str]:
        """Pipelined: the stages, micro-batches and bubble, and each stage's figures."""
        if not self.stages:
            return []
        sends = sum(s.send_bytes + s.return_bytes for s in self.stages)
        lines = [
            f"pipeline        {len(self.stages)} stages x {self.microbatches:,} micro-batches in "
            f"{len(self.pipeline_cycles):,} pipeline cycles; bubble "
            f"{100 * self.bubble_fraction:.1f}%; {sends:,} bytes between stages per micro-batch",
        ]
        for s in self.stages:
            lines.append(
                f"  stage {s.stage}  {'+'.join(s.blocks)}: forward {s.forward_cycles:,}, "
                f"backward {s.backward_cycles:,} cycles per micro-batch; update "
                f"{s.update_cycles:,}; {s.in_flight} in flight; peak tile "
                f"{s.peak_tile_bytes:,} B"
            )
        return lines

    def _category_lines(self) -> list[str]:
        """The fullest tile's bytes by category, when the report has them."""
        categories = self.fullest_tile_categories
        if not categories:
            return []
        parts = ", ".join(f"{name} {size:,}" for name, size in categories)
        return [f"  by category   tile {self.top_tiles[0].tile}: {parts}"]

    def cycles_by_op(self) -> list[tuple[str, int]]:
        totals: dict[str, int] = {}
        for step in self.supersteps:
            totals[step.op] = totals.get(step.op, 0) + step.cycles
        return sorted(totals.items(), key=lambda item: -item[1])

    # ---- JSON ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": SCHEMA, "version": VERSION}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in _ARRAYS:
                value = value.tolist()
            elif f.name in _RECORDS:
                value = [_figures(r) for r in value]
            out[f.name] = value
        out["latency"] = self.latency.to_dict()  # derived; not read back
        out.update(derived_fields(self))  # seconds_range, bounds (ipujax.bands); not read back
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_json(cls, text: str | bytes) -> CostReport:
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, TypeError, UnicodeDecodeError) as error:
            raise ReportError(f"a cost report must be JSON text: {error}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> CostReport:
        _check_header(data)
        defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.name in _LATER}
        data = {**defaults, **data}
        fields = {f.name for f in dataclasses.fields(cls)}
        missing = sorted(fields - set(data))
        if missing:
            raise ReportError(f"the cost report lacks the fields {missing}; was it cut short?")
        values = {name: data[name] for name in fields}
        _check_scalars(values)
        try:
            for name in _ARRAYS:
                values[name] = np.asarray(values[name], dtype=np.int64).reshape(
                    values["ipus"], values["tiles_per_ipu"]
                )
            for name, record in _RECORDS.items():
                values[name] = tuple(_record(record, r) for r in values[name])
            values["memory_categories"] = _categories(values["memory_categories"])
            values["pipeline_cycles"] = tuple(int(c) for c in values["pipeline_cycles"])
            values["caveats"] = _lines(values["caveats"])
        except (TypeError, ValueError) as error:
            raise ReportError(f"the cost report has a malformed field: {error}") from None
        return cls(**values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CostReport) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]


_SCALARS: dict[str, tuple[type, ...]] = {
    "target": (str,),
    "system": (str,),
    "ipus": (int,),
    "tiles_per_ipu": (int,),
    "clock_hz": (int, float),
    "bytes_per_tile": (int,),
    "total_cycles": (int,),
    "flops": (int,),
    "peak_flops_per_cycle": (int,),
    "exchange_bytes": (int,),
    "ipu_link_bytes": (int,),
    "streaming_bytes": (int,),
    "host_bytes": (int,),
    "microbatches": (int,),
    "device_iterations": (int,),
    "host_latency_cycles": (int,),
    "numerics": (str,),
}


def _check_scalars(values: dict[str, Any]) -> None:
    for name, types in _SCALARS.items():
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, types):
            raise ReportError(
                f"the cost report's {name!r} is {value!r}; expected "
                f"{' or '.join(t.__name__ for t in types)}"
            )


def _check_header(data: Any) -> None:
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ReportError(f"not an ipujax cost report: expected schema {SCHEMA!r}")
    version = data.get("version")
    if isinstance(version, bool) or version not in READABLE:
        raise ReportError(
            f"cost report version {data.get('version')!r} is not supported; "
            f"this ipujax reads versions {', '.join(map(str, READABLE))}"
        )


def _figures(record: Any) -> dict[str, Any]:
    """A record's figures for the JSON: its fields that compare."""
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record) if f.compare}


def _tuples(value: Any) -> Any:
    """JSON lists back into the tuples the records hold, at any depth."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _categories(raw: Any) -> tuple[tuple[str, int], ...]:
    """(category, bytes) pairs from their JSON lists, checked."""
    pairs = _tuples(raw)
    if not isinstance(pairs, tuple) or not all(
        isinstance(p, tuple)
        and len(p) == 2
        and isinstance(p[0], str)
        and isinstance(p[1], int)
        and not isinstance(p[1], bool)
        for p in pairs
    ):
        raise TypeError(f"memory_categories must be [name, bytes] pairs, got {raw!r}")
    return pairs


def _lines(raw: Any) -> tuple[str, ...]:
    """The caveats from their JSON list, checked."""
    if not isinstance(raw, list | tuple) or not all(isinstance(line, str) for line in raw):
        raise TypeError(f"caveats must be a list of strings, got {raw!r}")
    return tuple(raw)


def _record(record: type, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise TypeError(f"{record.__name__} entries must be objects, got {type(raw).__name__}")
    names = [f.name for f in dataclasses.fields(record)]
    values = {k: _tuples(v) for k, v in raw.items() if k in names}
    return record(**values)


def build_report(
    built: Built, caveats: tuple[str, ...] = (), device_iterations: int = 1
) -> CostReport:
    """The report of what `partitioner.build` made: its step cost, its memory per tile (and the
    IO tiles' streaming buffers), every IPU alike (SPMD); and what its figures assume."""
    mesh, cost, memory = built.mesh, built.cost, built.memory
    target = mesh.target
    io = io_tile_memory(built)
    pipeline = built.pipeline
    if pipeline is None:
        tiles = np.concatenate([memory.total, io]).reshape(1, -1)
        always = np.concatenate([memory.always_live, 0 * io]).reshape(1, -1)
        per_ipu = np.repeat(tiles, mesh.ipus, axis=0)
        always_per_ipu = np.repeat(always, mesh.ipus, axis=0)
    else:
        # Each IPU holds its own stage's tensors: its row is its stage's memory.
        stage = _stage_of_ipu(built)
        per_ipu = np.stack([m.total for m in built.stage_memories])[stage]
        always_per_ipu = np.stack([m.always_live for m in built.stage_memories])[stage]
    return CostReport(
        target=target.name,
        system=mesh.system.name if mesh.ipus > 1 else "single IPU",
        ipus=mesh.ipus,
        tiles_per_ipu=target.tiles_per_ipu,
        clock_hz=target.clock_hz,
        bytes_per_tile=target.bytes_per_tile,
        total_cycles=cost.total_cycles,
        flops=cost.flops,
        peak_flops_per_cycle=cost.peak_flops_per_cycle,
        exchange_bytes=cost.exchange_bytes,
        ipu_link_bytes=cost.link_bytes * mesh.ipus,
        streaming_bytes=cost.streaming_bytes * mesh.ipus,
        host_bytes=cost.host_bytes * mesh.ipus,
        # Every IPU runs the same per-IPU program (SPMD), so every IPU's tiles hold the same;
        # pipelined, every IPU of a stage.
        tile_memory=per_ipu.astype(np.int64),
        always_live=always_per_ipu.astype(np.int64),
        supersteps=_readable(cost.supersteps, ("source",)),
        collectives=_readable(cost.collectives, ("source", "why")),
        phases=cost.phases,
        top_tiles=_readable(
            with_io_tiles(built, fullest_tiles(memory, _memory_program(built), built.graph)),
            ("tensors",),
        ),
        memory_categories=_ipu_categories(memory, io),
        stages=() if pipeline is None else pipeline.stages,
        microbatches=0 if pipeline is None else pipeline.microbatches,
        pipeline_cycles=() if pipeline is None else pipeline.cycles,
        caveats=caveats + io_caveats(built),
        device_iterations=device_iterations,
        host_latency_cycles=target.host_latency_cycles,
    )


def _memory_program(built: Built) -> Program:
    """The program `built.memory` sweeps: pipelined, the fullest stage's own."""
    for program, memory in zip(built.stage_programs, built.stage_memories, strict=True):
        if memory is built.memory:
            return program
    return built.program


def _stage_of_ipu(built: Built) -> np.ndarray:
    """Each IPU's stage: its coordinate along the pipeline axis (IPUs in row-major mesh
    order, as a `jax.sharding.Mesh` lays out its devices)."""
    mesh = built.mesh
    assert built.pipeline is not None
    axis = mesh.axis_names.index(built.pipeline.axis)
    coords = np.unravel_index(np.arange(mesh.ipus), mesh.axis_shapes)
    return np.asarray(coords[axis])


def _readable(records: tuple[_R, ...], fields: tuple[str, ...]) -> tuple[_R, ...]:
    """The records with the files in their text `fields` named as a person names them
    (`examples/gpt/model.py:42`, not the absolute path jax recorded; `lowering.shorten_paths`):
    their source lines, why each collective ran, where each large tensor came from. Shortened
    here, once, so the tables, the trace, the HTML and the JSON all say the same, and the JSON
    round-trips exactly."""
    return tuple(per_record(records, lambda r: _readable_record(r, fields)))


def _readable_record(record: Any, fields: tuple[str, ...]) -> Any:
    """`record` with its text shortened; the record itself when it names no file."""
    changes = {}
    for name in fields:
        value = getattr(record, name)
        if (short := _short(value)) != value:
            changes[name] = short
    return dataclasses.replace(record, **changes) if changes else record


def _short(value: Any) -> Any:
    """`value` with its text shortened at any depth (a tile's tensors are (bytes, text))."""
    if isinstance(value, str):
        return shorten_paths(value)
    if isinstance(value, tuple):
        return tuple(_short(v) for v in value)
    return value


def _ipu_categories(memory: TileMemory, io: np.ndarray) -> tuple[tuple[str, int], ...]:
    """Each category's bytes over one IPU's tiles; the IO tiles' streaming buffers are
    not-always-live variables."""
    sums = {name: int(values.sum()) for name, values in memory.categories().items()}
    sums["variables_not_always_live"] += int(io.sum())
    return tuple((name, sums[name]) for name in MEMORY_CATEGORIES)


def popvision_name(category: str) -> str:
    """What PopVision (libpva's `tile.memory.category.<name>`) calls a category's bytes."""
    return POPVISION_NAMES.get(category, category)

"""The cost report as a Chrome/Perfetto trace ("traceEvents" JSON), laid out like PopVision's
execution trace.

Supersteps run one after another (BSP), so each starts where the one before it ended. A superstep
becomes up to four consecutive "X" (complete) slices on its sync group's thread: Sync, DoExchange
(when it exchanges on chip), GlobalExchange (when it is a collective over the IPU-Links) and
OnTileExecute (its compute set), each named by the step kind, op and source line. Phases make a
timeline of their own: each phase's exposed streaming and compute on one thread, the IO path's
StreamCopy windows on another. `ts`/`dur` are microseconds: cycles / clock_hz * 1e6.
`pid` is the IPU: every IPU runs the same program (SPMD), so each gets the same slices (the
first `MAX_IPUS` are drawn).
"""

from __future__ import annotations

import json
from typing import Any

from ipujax.report import CollectiveCost, CostReport, PhaseCost, SuperstepCost
from ipujax.views import metrics as m
from ipujax.views.metrics import short_source, shorten_paths

MAX_IPUS = 16  # IPUs drawn: every IPU runs the same (SPMD) program, so more add nothing
_LINKS = "IPU-Links (GlobalExchange)"
_PHASES = "phases (StreamCopy)"
_IO = "IO path (StreamCopy)"


class _Threads:
    """Stable integer thread ids per (IPU, thread name), and their metadata events."""

    def __init__(self) -> None:
        self.ids: dict[tuple[int, str], int] = {}

    def tid(self, pid: int, name: str) -> int:
        key = (pid, name)
        if key not in self.ids:
            self.ids[key] = 1 + sum(1 for p, _ in self.ids if p == pid)
        return self.ids[key]

    def metadata(self) -> list[dict[str, Any]]:
        return [
            event
            for (pid, name), tid in self.ids.items()
            for event in (
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}},
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": pid,
                    "tid": tid,
                    "args": {"sort_index": tid},
                },
            )
        ]


def _step_slices(step: SuperstepCost) -> list[tuple[str, int]]:
    """(PopVision step kind, cycles) in the order a superstep runs them."""
    # Streaming memory and the host are StreamCopy in PopVision; IPU-Links GlobalExchange.
    off_chip = "StreamCopy" if step.kind in ("stream", "host") else "GlobalExchange"
    parts = [
        ("Sync", step.sync_cycles),
        ("DoExchange", step.exchange_cycles),
        (off_chip, step.link_cycles),
        ("OnTileExecute", step.compute_cycles),
    ]
    return [(kind, cycles) for kind, cycles in parts if cycles > 0]


def _us(cycles: int, clock_hz: float) -> float:
    return cycles * 1e6 / clock_hz


def _collective_args(coll: CollectiveCost, index: int) -> dict[str, Any]:
    return {
        "collective": index,
        "kind": coll.kind,
        "axes": list(coll.axes),
        "group_size": coll.group_size,
        "bytes_per_ipu": coll.bytes_per_ipu,
        "collective_cycles": coll.cycles,
        "why": shorten_paths(coll.why),
    }


def _match_collectives(report: CostReport) -> tuple[dict[int, dict], list[int]]:
    """The collective record of each superstep that runs one ({step index: args}), matched by
    name (or op) and source line in order; and the records that match no superstep."""
    waiting: dict[tuple[str, str], list[int]] = {}
    for index, coll in enumerate(report.collectives):
        waiting.setdefault((coll.op, coll.source), []).append(index)
    matched: dict[int, dict] = {}
    for index, step in enumerate(report.supersteps):
        if step.link_cycles <= 0 and step.kind != "collective":
            continue
        for key in ((step.name, step.source), (step.op, step.source)):
            if waiting.get(key):
                found = waiting[key].pop(0)
                matched[index] = _collective_args(report.collectives[found], found)
                break
    return matched, sorted(i for rest in waiting.values() for i in rest)


def _superstep_events(report: CostReport, threads: _Threads, ipus: int) -> list[dict]:
    events: list[dict[str, Any]] = []
    collectives, _ = _match_collectives(report)
    cursor = 0
    for index, step in enumerate(report.supersteps):
        where = short_source(step.source) if step.source else "no source line"
        for kind, cycles in _step_slices(step):
            start, end = _us(cursor, report.clock_hz), _us(cursor + cycles, report.clock_hz)
            cursor += cycles
            args = {
                "superstep": index,
                "step_name": step.name,
                "op": step.op,
                "source": shorten_paths(step.source),
                "cycles": cycles,
                "superstep_cycles": step.cycles,
                "tiles": step.tiles,
                "flops": step.flops,
                "exchange_bytes": step.exchange_bytes,
                "sync_group": step.sync_group,
                **collectives.get(index, {}),
            }
            for pid in range(ipus):
                events.append(
                    {
                        "ph": "X",
                        "cat": kind,
                        "name": f"{kind}: {step.op} ({where})",
                        "pid": pid,
                        "tid": threads.tid(pid, f"sync group {step.sync_group}"),
                        "ts": start,
                        "dur": end - start,
                        "args": args,
                    }
                )
    return events


def _unmatched_collective_events(report: CostReport, threads: _Threads, ipus: int) -> list[dict]:
    """Collectives that no superstep carries (reports that keep them apart): GlobalExchange
    slices after the program, one after another, on every IPU's IPU-Links thread."""
    _, unmatched = _match_collectives(report)
    events: list[dict[str, Any]] = []
    cursor = report.total_cycles
    for index in unmatched:
        coll = report.collectives[index]
        start, end = _us(cursor, report.clock_hz), _us(cursor + coll.cycles, report.clock_hz)
        cursor += coll.cycles
        for pid in range(ipus):
            events.append(
                {
                    "ph": "X",
                    "cat": "GlobalExchange",
                    "name": f"GlobalExchange: {coll.kind} over {','.join(coll.axes) or '-'}",
                    "pid": pid,
                    "tid": threads.tid(pid, _LINKS),
                    "ts": start,
                    "dur": end - start,
                    "args": {
                        **_collective_args(coll, index),
                        "cycles": coll.cycles,
                        "op": coll.op,
                        "source": shorten_paths(coll.source),
                    },
                }
            )
    return events


def _phase_events(report: CostReport, threads: _Threads, ipus: int) -> list[dict]:
    """The phase timeline: on one thread each phase as a slice of its cycles (what it computes
    and exposes in its args); on another the IO path's window for each phase, where it runs
    (during the previous phase's compute when IO tiles hide it)."""
    events: list[dict[str, Any]] = []
    clock = report.clock_hz
    for pid in range(ipus):
        cursor = 0
        for index, phase in enumerate(report.phases):
            args = _phase_args(phase, index)
            spans = (
                (f"StreamCopy: phase {phase.name}", _PHASES, cursor, phase.cycles),
                (
                    f"StreamCopy: IO for {phase.name}",
                    _IO,
                    cursor - phase.overlapped_cycles,
                    phase.stream_cycles,
                ),
            )
            for name, thread, start, cycles in spans:
                if cycles <= 0:
                    continue
                ts = _us(start, clock)
                events.append(
                    {
                        "ph": "X",
                        "cat": "StreamCopy",
                        "name": name,
                        "pid": pid,
                        "tid": threads.tid(pid, thread),
                        "ts": ts,
                        "dur": _us(start + cycles, clock) - ts,
                        "args": args,
                    }
                )
            cursor += phase.cycles
    return events


def _phase_args(phase: PhaseCost, index: int) -> dict[str, Any]:
    return {
        "phase": index,
        "cycles": phase.cycles,
        "compute_cycles": phase.compute_cycles,
        "stream_cycles": phase.stream_cycles,
        "overlapped_cycles": phase.overlapped_cycles,
        "load_bytes": phase.load_bytes,
        "store_bytes": phase.store_bytes,
        "gathered_bytes": phase.link_bytes,
        "kept_bytes": phase.kept_bytes,
        "streaming_bytes": phase.streaming_bytes,
        "peak_tile_bytes": phase.peak_tile_bytes,
    }


def _pipeline_events(report: CostReport, threads: _Threads) -> list[dict]:
    """The pipeline timeline, in a process of its own: a thread per stage, a slice per
    micro-batch's forward or backward on it; the update after the last cycle."""
    events: list[dict[str, Any]] = []
    pid = MAX_IPUS  # after the IPUs' processes
    clock = report.clock_hz
    for block in m.pipeline_blocks(report):
        ts = _us(block.start, clock)
        events.append(
            {
                "ph": "X",
                "cat": "pipeline",
                "name": f"{block.kind} {block.microbatch}",
                "pid": pid,
                "tid": threads.tid(pid, f"stage {block.stage}"),
                "ts": ts,
                "dur": _us(block.start + block.cycles, clock) - ts,
                "args": {
                    "stage": block.stage,
                    "micro_batch": block.microbatch,
                    "pipeline_cycle": block.cycle,
                    "cycles": block.cycles,
                },
            }
        )
    end = sum(report.pipeline_cycles)
    for stage in report.stages:
        ts = _us(end, clock)
        events.append(
            {
                "ph": "X",
                "cat": "pipeline",
                "name": "update",
                "pid": pid,
                "tid": threads.tid(pid, f"stage {stage.stage}"),
                "ts": ts,
                "dur": _us(end + stage.update_cycles, clock) - ts,
                "args": {"stage": stage.stage, "cycles": stage.update_cycles},
            }
        )
    return events


def build_trace(report: CostReport) -> dict[str, Any]:
    threads = _Threads()
    ipus = min(report.ipus, MAX_IPUS)
    slices = (
        _superstep_events(report, threads, ipus)
        + _unmatched_collective_events(report, threads, ipus)
        + _phase_events(report, threads, ipus)
        + _pipeline_events(report, threads)
    )
    return {
        "traceEvents": _process_events(report, ipus) + threads.metadata() + slices,
        "displayTimeUnit": "ns",
        "otherData": _other_data(report, ipus),
    }


def _process_events(report: CostReport, ipus: int) -> list[dict[str, Any]]:
    """Each IPU's process name and place; the pipeline's process when the step has stages."""
    processes = [
        event
        for pid in range(ipus)
        for event in (
            {
                "ph": "M",
                "name": "process_name",
                "pid": pid,
                "tid": 0,
                "args": {"name": f"IPU {pid} ({report.target})"},
            },
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": pid,
                "tid": 0,
                "args": {"sort_index": pid},
            },
        )
    ]
    if report.stages:
        processes.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": MAX_IPUS,
                "tid": 0,
                "args": {
                    "name": f"pipeline: {len(report.stages)} stages, "
                    f"{report.microbatches} micro-batches"
                },
            }
        )
    return processes


def _other_data(report: CostReport, ipus: int) -> dict[str, Any]:
    return {
        "generator": "ipujax cost-report",
        "target": report.target,
        "system": report.system,
        "ipus": report.ipus,
        "ipus_drawn": ipus,
        "note": "every IPU runs the same program (SPMD); supersteps run one after another",
        "tiles_per_ipu": report.tiles_per_ipu,
        "clock_hz": report.clock_hz,
        "total_cycles": report.total_cycles,
        "seconds": report.seconds,
    }


def trace_json(report: CostReport) -> str:
    return json.dumps(build_trace(report), separators=(",", ":"))

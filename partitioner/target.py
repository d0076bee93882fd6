"""The hardware model: one IPU chip's numbers and the cost formulas built from them.

Every constant cites its row of `shared/ipu_facts.md` (tags: V Graphcore datasheet or docs,
C a constant inside Graphcore's own planners, D derived by arithmetic, S secondary source) or says
that it is an assumption of ours and why. The partitioner plans with these formulas and the cost
report sums them, so one formula serves both: a plan is chosen by the cycles it will be charged.

`Target` lives in the partitioner because planning a matmul over tiles needs it; `ipujax.Target`
re-exports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True, slots=True)
class Target:
    """One IPU chip (all IPUs of a system are alike) and the system it sits in."""

    name: str
    tiles_per_ipu: int
    bytes_per_tile: int
    clock_hz: float
    threads_per_tile: int = 6  # V: six hardware worker threads per tile, all chips
    # Matmul (AMP) FLOP per cycle per tile by input precision. C: 16 AMP units x 4 x 2 (MK2/Bow).
    amp_flops_per_cycle_half: int = 128
    amp_flops_per_cycle_float: int = 32  # D: 62.5 TFLOPS / (1472 x 1.325 GHz)
    # Elementwise arithmetic runs on the 64-bit vector datapath: 8 bytes of operands per cycle,
    # i.e. 2 f32 or 4 f16 lanes (S: IPU tile ISA; one instruction per cycle across 6 threads).
    vector_bytes_per_cycle: int = 8
    # Assumption: a transcendental (exp, log, tanh, ...) takes 4 cycles per element; Poplar
    # evaluates them with multi-instruction sequences, not the AMP.
    transcendental_cycles: int = 4
    # Assumption: a compute set costs each tile a fixed 60 cycles to launch its vertices on the
    # six workers and wait for them (PopLibs' planners add tens of cycles per vertex).
    compute_set_overhead_cycles: int = 60
    exchange_bytes_per_cycle: int = 4  # C: PopLibs exchangeBytesPerCycle, send and receive
    exchange_overhead_cycles: int = 100  # C: fixed overhead per exchange in PopLibs' planners
    sync_cycles: int = 90  # C: on-chip sync in PopLibs' planners
    # Linear mapping: grains of 8 bytes (the vector width) and at least 128 bytes per tile (C).
    grain_bytes: int = 8
    min_bytes_per_tile: int = 128
    # PopLibs plans matmul temporaries within this share of tile memory (C, V: default 0.6).
    available_memory_proportion: float = 0.6
    # Assumption: code and control state a tile holds before any vertex: 16 KiB, plus per
    # distinct compute set or exchange it takes part in, 64 bytes of control code and vertex
    # state (identical steps share code: see partitioner.memory).
    fixed_code_bytes: int = 16 * 1024
    code_bytes_per_step: int = 64
    # IPU-Links, as Poplar's own multi-IPU model assumes: 128 x 2^30 bit/s each way per link,
    # 0.85 of it usable (C). A collective runs as a bidirectional ring (GCL's "bidirectional
    # pair", V), so each IPU sends over two links at once (our assumption of the ring shape).
    ipu_link_bytes_per_second: float = 128 * 2**30 / 8
    ipu_link_efficiency: float = 0.85
    ring_links: int = 2
    # Each ring step waits for the previous one's data: the IPU -> IPU latency of Graphcore's
    # pipeline cost model (C: 3,000 cycles).
    ipu_link_latency_cycles: int = 3000
    # Beyond a Pod64, rings cross Gateway-Links: 2 x 100 Gb/s per 4-IPU machine (V), so
    # 6.25 GB/s per IPU.
    gateway_bytes_per_second_per_ipu: float = 2 * 100e9 / 8 / 4
    # Global sync: 15 ns per hop, there and back, hops = 1 + N/4 for N IPUs (C).
    global_sync_hop_seconds: float = 15e-9
    # Streaming memory: no published bandwidth; the upper bound is PCIe Gen4 x8 per IPU to its
    # gateway, about 16 GB/s each way (D). Capacity: 128 GB of DRAM per 4-IPU machine as
    # shipped (V), so 32 GB per IPU.
    streaming_bytes_per_second: float = 16e9
    streaming_bytes_per_ipu: int = 32 * 10**9
    # Tiles per IPU kept for streaming in phased programs (PopXL's GPT-3 example used 128): they
    # load the next phase while the others compute. Zero: phases load and compute in turn.
    io_tiles: int = 0

    def __post_init__(self) -> None:
        if self.tiles_per_ipu < 1 or self.bytes_per_tile < 1 or self.clock_hz <= 0:
            raise ValueError(
                f"a Target needs tiles_per_ipu >= 1, bytes_per_tile >= 1 and clock_hz > 0; got "
                f"{self.tiles_per_ipu}, {self.bytes_per_tile}, {self.clock_hz}"
            )

    # ---- presets ---------------------------------------------------------------------------

    @classmethod
    def mk1(cls) -> Target:
        """GC2: 1,216 tiles (V), 256 KiB each (V/C), 1.6 GHz (D: 124.5 TF / (1216 x 64))."""
        return cls(
            name="mk1",
            tiles_per_ipu=1216,
            bytes_per_tile=262_144,
            clock_hz=1.6e9,
            amp_flops_per_cycle_half=64,  # C: 8 units x 4 inputs x 2
            amp_flops_per_cycle_float=16,
        )

    @classmethod
    def mk2(cls) -> Target:
        """GC200: 1,472 tiles (V), 624 KiB each (D), 1.325 GHz (D: Pod64 15.978 PF / ...)."""
        return cls(name="mk2", tiles_per_ipu=1472, bytes_per_tile=638_976, clock_hz=1.325e9)

    @classmethod
    def bow(cls) -> Target:
        """Bow: the GC200 die at 1.85 GHz (C: Graphcore's auto-pipeline cluster config)."""
        return cls(name="bow", tiles_per_ipu=1472, bytes_per_tile=638_976, clock_hz=1.85e9)

    def with_tiles(self, tiles: int) -> Target:
        return replace(self, tiles_per_ipu=tiles)

    # ---- cost formulas ---------------------------------------------------------------------

    def amp_flops_per_cycle(self, dtype: np.dtype) -> int:
        """Matmul rate. Half precision (f16; bf16, which the IPU lacks, is costed as f16) uses
        the fast AMP path; everything else the f32 path."""
        return (
            self.amp_flops_per_cycle_half
            if np.dtype(dtype).itemsize <= 2
            else (self.amp_flops_per_cycle_float)
        )

    def vector_elements_per_cycle(self, dtype: np.dtype) -> int:
        """Elementwise rate: lanes of the 64-bit datapath, at least one element per cycle."""
        return max(1, self.vector_bytes_per_cycle // np.dtype(dtype).itemsize)

    def matmul_cycles(self, flops: int, dtype: np.dtype) -> int:
        """Cycles for one tile's matmul work, plus the compute set's overhead."""
        return math.ceil(flops / self.amp_flops_per_cycle(dtype)) + self.compute_set_overhead_cycles

    def vector_cycles(self, elements: int, dtype: np.dtype, transcendentals: int = 0) -> int:
        """Cycles for one tile's elementwise work, plus the compute set's overhead."""
        arithmetic = math.ceil(elements / self.vector_elements_per_cycle(dtype))
        special = transcendentals * self.transcendental_cycles
        return arithmetic + special + self.compute_set_overhead_cycles

    def exchange_cycles(self, busiest_tile_bytes: int) -> int:
        """On-chip exchange: the busiest tile's bytes at 4 B/cycle, plus the fixed overhead."""
        if busiest_tile_bytes <= 0:
            return 0
        transfer = math.ceil(busiest_tile_bytes / self.exchange_bytes_per_cycle)
        return transfer + self.exchange_overhead_cycles

    def global_sync_cycles(self, ipus: int) -> int:
        """Sync across `ipus` IPUs: 2 x 15 ns x (1 + ipus // 4) hops, in tile cycles."""
        return math.ceil(2 * self.global_sync_hop_seconds * (1 + ipus // 4) * self.clock_hz)

    def link_cycles(self, bytes_per_ipu: float, steps: int, over_gateway: bool) -> int:
        """A ring collective: each IPU's bytes at its ring bandwidth, plus each step's latency."""
        if bytes_per_ipu <= 0:
            return 0
        if over_gateway:
            rate = self.gateway_bytes_per_second_per_ipu
        else:
            rate = self.ring_links * self.ipu_link_bytes_per_second * self.ipu_link_efficiency
        transfer = math.ceil(bytes_per_ipu * self.clock_hz / rate)
        return transfer + steps * self.ipu_link_latency_cycles

    def streaming_cycles(self, nbytes: int) -> int:
        """Moving bytes between streaming memory and one IPU, at the streaming bandwidth."""
        return math.ceil(nbytes * self.clock_hz / self.streaming_bytes_per_second) if nbytes else 0

    @property
    def matmul_memory_budget(self) -> int:
        """Bytes per tile a matmul plan may use for its operand blocks and partials."""
        return int(self.available_memory_proportion * self.bytes_per_tile)

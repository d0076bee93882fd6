"""The hardware model: one IPU chip's numbers, and the system it sits in.

Every constant is listed in docs/target.md with its value for each preset and its public source
(tags: V Graphcore datasheet or docs, C a constant inside Graphcore's own planners, D derived by
arithmetic, S secondary source, A an assumption of ours, with the reason). The cost formulas that
turn these numbers into cycles are in `partitioner.cost`, one module per concern; the partitioner
plans with the same formulas the cost report sums, so a plan is chosen by what it is charged.

`Target` lives in the partitioner because planning a matmul over tiles needs it; `ipujax.Target`
re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

DEFAULT_IO_TILES = 128  # C: PopXL's GPT-3 175B on a Pod256 (docs/target.md)


@dataclass(frozen=True, slots=True)
class VertexKind:
    """One kind of vertex as PopLibs writes it: the code its codelets share on a tile (the
    supervisor and worker frameworks), the code of each codelet (one op or element type), and
    the state a tile holds for it in each compute set."""

    name: str
    shared_code_bytes: int
    codelet_code_bytes: int
    state_bytes: int


# C, D (docs/target.md, "Tile memory and mapping"): code is 4 bytes an instruction of PopLibs'
# assembly codelets, state their vertex fields.
VERTEX_KINDS = (
    VertexKind("amp", 588, 664, 64),  # ConvPartial1x1Out: supervisor, f32 worker, 28 + 36 B
    VertexKind("elementwise", 396, 232, 16),  # BinaryOp1D: framework, one op, 4 fields
    VertexKind("reduce", 0, 232, 12),  # ReduceAdd: one type's section, 3 fields
    VertexKind("copy", 432, 12, 32),  # MultiSlice: common code, one entry, 8 fields
)


@dataclass(frozen=True, slots=True)
class Target:
    """One IPU chip (all IPUs of a system are alike) and the system it sits in."""

    # Each field's value per preset, its tag and its public source: docs/target.md, in the
    # section named in the comment above it.
    # -- Chip
    name: str
    tiles_per_ipu: int  # V
    bytes_per_tile: int  # D: 624 KiB on MK2/Bow, the "900 MB" chip
    clock_hz: float  # D (MK1, MK2: peak FLOPS / tiles / rate), C + D (Bow: 1.85 GHz)
    threads_per_tile: int = 6  # V, C: six worker threads per tile
    # -- Compute: AMP FLOP per cycle per tile by input precision (C, D), the peak; and the
    # vector path's 64-bit data path, 2 f32 or 4 f16 lanes (C: PopLibs' elementwise tables),
    # whose per-op cycles are in `cost.vector` and `cost.copies`.
    amp_flops_per_cycle_half: int = 128
    amp_flops_per_cycle_float: int = 32
    vector_bytes_per_cycle: int = 8
    # The AMP as PopLibs' matmul vertex drives it (C): conv units per tile, input channels per
    # group (16 halves or 8 floats), output channels per group, and the bytes per cycle that
    # load its coefficients (16, halved by PopLibs' default 64-bit loads).
    conv_units: int = 16
    amp_in_chans_half: int = 16
    amp_in_chans_float: int = 8
    amp_out_chans: int = 16
    coeff_load_bytes_per_cycle: int = 8
    # -- Exchange and sync (C: PopLibs' planners)
    exchange_bytes_per_cycle: int = 4
    exchange_overhead_cycles: int = 100
    sync_cycles: int = 90
    # -- Tile memory and mapping: linear mapping's grain and minimum per tile (C), the share of
    # a tile a matmul plan's temporaries may use (C, V). Code and state as PopVision counts them
    # (partitioner.memory.code): each vertex kind's (C, D), the random seed and supervisor
    # state on every tile (D: 48 KB per IPU), exchange code per exchange and per message at
    # each end (A), control code per step (A), the supervisor's stack (C) and each worker's
    # (A). Identical steps share code.
    grain_bytes: int = 8
    min_bytes_per_tile: int = 128
    available_memory_proportion: float = 0.6
    vertex_kinds: tuple[VertexKind, ...] = VERTEX_KINDS
    vertex_state_bytes_per_tile: int = 32
    exchange_code_bytes_per_exchange: int = 32
    exchange_code_bytes_per_message: int = 24
    control_code_bytes_per_step: int = 24
    supervisor_stack_bytes: int = 40
    worker_stack_bytes: int = 32
    # -- IPU-Links and systems: 15.75 GB/s raw each way per IPU-Link (S, D: PCIe Gen4 x8
    # signalling), 0.85 of it usable (C: PopLibs' multi-IPU model). Per IPU, 4 links to its
    # pair partner, 2 across to the machine's other pair, 2 up and 2 down the column of
    # machines (C: the IPU Model's counts; where they lead, A). GCL runs at most two
    # bidirectional rings at once (V: its quad-directional ring), 3,000 cycles per ring step
    # (C value, A use). Between Pod64s, 2 GW-Links of 100 Gb/s per machine (V), the same 0.85
    # usable (A).
    ipu_link_bytes_per_second: float = 15.75e9
    ipu_link_efficiency: float = 0.85
    rung_links: int = 4
    cross_links: int = 2
    column_links: int = 2
    collective_rings: int = 2
    ipu_link_latency_cycles: int = 3000
    gateway_link_bytes_per_second: float = 100e9 / 8
    gateway_links_per_machine: int = 2
    gateway_link_efficiency: float = 0.85
    # -- Exchange and sync, across IPUs: 15 ns per hop there and back, hops = 1 + N/4 for N
    # IPUs (C: PopLibs' multi-IPU model; A: applied to Pods).
    global_sync_hop_seconds: float = 15e-9
    # -- Streaming memory, host and phases: bandwidth bounded by PCIe Gen4 x8 per IPU, each way
    # at once (D), 128 GB per 4-IPU machine (S), a fixed latency per transfer (A). IO tiles
    # stream while the others compute: None is PopXL's GPT-3 choice, 128, but at most an eighth
    # of the tiles (a cut-down test chip keeps most tiles computing); 0 turns them off.
    streaming_bytes_per_second: float = 16e9
    streaming_bytes_per_ipu: int = 32 * 10**9
    io_tiles: int | None = None
    streaming_latency_cycles: int = 3000
    # Host <-> IPU, per step: 7 GB/s and 50,000 cycles per transfer in Graphcore's own pipeline
    # cost model (C); the machine's 100 GbE host link (V) shared by its IPUs caps it.
    host_bytes_per_second: float = 7e9
    host_latency_cycles: int = 50_000
    host_link_bytes_per_second_per_machine: float = 100e9 / 8
    # Pipeline stages send activations and gradients IPU to IPU at 70 GiB/s after 3,000 idle
    # cycles, once every stage has finished its pipeline cycle (C: Graphcore's auto-pipeliner,
    # ipu_tensorflow_addons auto_pipeline cluster_info "sendGBps": 70, "sendIdleCycle": 3000).
    pipeline_send_bytes_per_second: float = 70 * 2**30
    pipeline_send_latency_cycles: int = 3000

    def __post_init__(self) -> None:
        if self.tiles_per_ipu < 1 or self.bytes_per_tile < 1 or self.clock_hz <= 0:
            raise ValueError(
                f"a Target needs tiles_per_ipu >= 1, bytes_per_tile >= 1 and clock_hz > 0; got "
                f"{self.tiles_per_ipu}, {self.bytes_per_tile}, {self.clock_hz}"
            )

    # ---- presets ---------------------------------------------------------------------------

    @classmethod
    def mk1(cls) -> Target:
        """GC2: 1,216 tiles of 256 KiB (S), 1.6 GHz (D: 124.5 TF / (1216 x 64))."""
        return cls(
            name="mk1",
            tiles_per_ipu=1216,
            bytes_per_tile=262_144,
            clock_hz=1.6e9,
            amp_flops_per_cycle_half=64,  # C: 8 units x 4 inputs x 2
            amp_flops_per_cycle_float=16,
            conv_units=8,
        )

    @classmethod
    def mk2(cls) -> Target:
        """GC200: 1,472 tiles (V) of 624 KiB (D), 1.325 GHz (D: 15.978 PF / (64 x 1472 x 128))."""
        return cls(name="mk2", tiles_per_ipu=1472, bytes_per_tile=638_976, clock_hz=1.325e9)

    @classmethod
    def bow(cls) -> Target:
        """Bow: the GC200 die at 1.85 GHz (C: Graphcore's auto-pipeline config; D: Pod256)."""
        return cls(name="bow", tiles_per_ipu=1472, bytes_per_tile=638_976, clock_hz=1.85e9)

    def with_tiles(self, tiles: int) -> Target:
        return replace(self, tiles_per_ipu=tiles)

    @property
    def phase_io_tiles(self) -> int:
        """The tiles of each IPU that stream in a phased program."""
        if self.io_tiles is None:
            return min(DEFAULT_IO_TILES, self.tiles_per_ipu // 8)
        return self.io_tiles

    @property
    def bytes_per_ipu(self) -> int:
        """The chip's tile memory, all tiles together."""
        return self.tiles_per_ipu * self.bytes_per_tile

    @property
    def matmul_memory_budget(self) -> int:
        """Bytes per tile a matmul plan may use for its operand blocks and partials."""
        return int(self.available_memory_proportion * self.bytes_per_tile)

    def vertex_kind(self, name: str) -> VertexKind:
        """The code and state of vertex kind `name` (each op's: `code_memory.OP_VERTEX_KINDS`)."""
        for kind in self.vertex_kinds:
            if kind.name == name:
                return kind
        raise KeyError(f"{self.name} has no vertex kind {name!r}")

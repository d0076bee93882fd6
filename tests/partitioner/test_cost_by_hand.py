"""Cost figures derived by hand from the Target's constants and the documented formulas.

Every expected number is worked out in a comment from docs/target.md and the formulas of
`partitioner/cost/`; none is computed by calling the code path under test.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from helpers import BOW_BYTES_PER_TILE, compile_for, device_cycles, device_steps, spec, target

import ipujax
from partitioner.cost.compute import matmul_cycles, vector_cycles, vector_elements_per_cycle
from partitioner.cost.exchange import exchange_cycles
from partitioner.matmul_plan import plan_matmul

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)

# ---- presets -------------------------------------------------------------------------------


def test_bow_preset_numbers() -> None:
    t = ipujax.Target.bow()
    assert t.name == "bow"
    assert t.tiles_per_ipu == 1472  # V
    assert t.bytes_per_tile == 638_976  # D: 624 KiB = 624 * 1024
    assert t.bytes_per_tile == 624 * 1024
    assert t.clock_hz == 1.85e9  # C
    assert t.threads_per_tile == 6
    assert t.amp_flops_per_cycle_half == 128  # 16 AMP units x 4 x 2
    assert t.amp_flops_per_cycle_float == 32


def test_mk2_preset_numbers() -> None:
    t = ipujax.Target.mk2()
    assert (t.tiles_per_ipu, t.bytes_per_tile, t.clock_hz) == (1472, 638_976, 1.325e9)
    assert (t.amp_flops_per_cycle_half, t.amp_flops_per_cycle_float) == (128, 32)


def test_mk1_preset_numbers() -> None:
    t = ipujax.Target.mk1()
    assert (t.tiles_per_ipu, t.bytes_per_tile) == (1216, 262_144)  # 256 KiB
    assert t.clock_hz == 1.6e9
    assert (t.amp_flops_per_cycle_half, t.amp_flops_per_cycle_float) == (64, 16)


@pytest.mark.parametrize(
    ("preset", "half_tflops", "float_tflops"),
    [
        # docs/target.md, "Peak rates the presets imply": 124.5/31.1, 250/62.5, 350/87.5.
        ("mk1", 124.5, 31.1),
        ("mk2", 250.0, 62.5),
        ("bow", 350.0, 87.5),
    ],
)
def test_presets_reproduce_datasheet_peaks(
    preset: str, half_tflops: float, float_tflops: float
) -> None:
    # peak = tiles x FLOP/cycle/tile x clock; e.g. Bow fp16 1472 x 128 x 1.85e9 = 348.6 TFLOPS,
    # sold as 350. Within 1% of the datasheet figure.
    t = getattr(ipujax.Target, preset)()
    half = t.tiles_per_ipu * t.amp_flops_per_cycle_half * t.clock_hz / 1e12
    single = t.tiles_per_ipu * t.amp_flops_per_cycle_float * t.clock_hz / 1e12
    assert half == pytest.approx(half_tflops, rel=0.01)
    assert single == pytest.approx(float_tflops, rel=0.01)


def test_with_tiles_changes_only_the_tile_count() -> None:
    t = ipujax.Target.bow().with_tiles(16)
    assert t.tiles_per_ipu == 16
    assert t.bytes_per_tile == 638_976
    assert t.clock_hz == 1.85e9
    assert t.name == "bow"


@pytest.mark.parametrize(
    "bad", [{"tiles_per_ipu": 0}, {"bytes_per_tile": 0}, {"clock_hz": 0.0}, {"clock_hz": -1.0}]
)
def test_target_rejects_nonsense(bad: dict) -> None:
    fields = {"name": "x", "tiles_per_ipu": 4, "bytes_per_tile": 1024, "clock_hz": 1e9, **bad}
    with pytest.raises(ValueError):
        ipujax.Target(**fields)


def test_matmul_memory_budget() -> None:
    # 0.6 x 638,976 = 383,385.6 -> 383,385; MK1: 0.6 x 262,144 = 157,286.4 -> 157,286.
    assert ipujax.Target.bow().matmul_memory_budget == 383_385
    assert ipujax.Target.mk1().matmul_memory_budget == 157_286


# ---- formulas ------------------------------------------------------------------------------


def test_exchange_cycles() -> None:
    t = ipujax.Target.bow()
    assert exchange_cycles(t, 0) == 0  # nothing moves: no exchange at all
    assert exchange_cycles(t, -8) == 0
    assert exchange_cycles(t, 400) == 100 + 100  # 400 B / 4 B per cycle + 100 overhead
    assert exchange_cycles(t, 1) == 1 + 100  # ceil(1 / 4) = 1
    assert exchange_cycles(t, 5) == 2 + 100  # ceil(5 / 4) = 2
    assert exchange_cycles(t, 1024) == 256 + 100


def test_vector_cycles() -> None:
    t = ipujax.Target.bow()
    # 8 bytes per cycle: 2 f32 lanes, 4 f16 lanes, 8 int8 lanes, 1 f64 lane; + 60 overhead.
    assert vector_cycles(t, 64, F32) == 64 // 2 + 60
    assert vector_cycles(t, 64, F16) == 64 // 4 + 60
    assert vector_cycles(t, 64, np.dtype(np.int8)) == 64 // 8 + 60
    assert vector_cycles(t, 64, np.dtype(np.float64)) == 64 + 60
    assert vector_cycles(t, 5, F32) == 3 + 60  # ceil(5 / 2)
    # 4 cycles per transcendental on top of the arithmetic.
    assert vector_cycles(t, 64, F32, transcendentals=64) == 32 + 64 * 4 + 60
    assert vector_cycles(t, 0, F32) == 60


def test_vector_lanes() -> None:
    t = ipujax.Target.bow()
    assert vector_elements_per_cycle(t, F32) == 2
    assert vector_elements_per_cycle(t, F16) == 4
    assert vector_elements_per_cycle(t, np.dtype(np.complex128)) == 1  # at least one per cycle


def test_matmul_cycles() -> None:
    bow, mk1 = ipujax.Target.bow(), ipujax.Target.mk1()
    flops = 1000
    assert matmul_cycles(bow, flops, F16) == math.ceil(1000 / 128) + 60 == 8 + 60
    assert matmul_cycles(bow, flops, F32) == math.ceil(1000 / 32) + 60 == 32 + 60
    assert matmul_cycles(mk1, flops, F16) == 16 + 60  # ceil(1000 / 64)
    assert matmul_cycles(mk1, flops, F32) == 63 + 60  # ceil(1000 / 16) = 62.5 -> 63
    # bf16 is costed as f16 (2-byte inputs take the fast AMP path).
    assert matmul_cycles(bow, flops, np.dtype(ml_dtypes.bfloat16)) == 8 + 60


# ---- whole programs on a 16-tile Bow ---------------------------------------------------------


def _only_step(compiled: ipujax.Compiled) -> ipujax.SuperstepCost:
    steps = device_steps(compiled.cost_report())
    assert len(steps) == 1, steps
    return steps[0]


def test_add_of_aligned_inputs_needs_no_exchange() -> None:
    # Linear layout of f32[4096] on 16 tiles: grain 8 B / 4 = 2 elements; at least
    # max(2, 128 B / 4) = 32 elements per tile; tiles used = min(16, 4096 // 32 = 128) = 16;
    # 4096 / 16 = 256 elements per tile (a whole number of grains). x goes on tiles 0..15; the
    # next linear tensor starts at 16 % 16 = 0, so y is on tiles 0..15 too, with the same layout.
    # The add follows x's layout, y is already there: nothing moves, exchange 0 cycles.
    # Compute: one FLOP per element, 256 per tile, 2 f32 lanes: ceil(256 / 2) + 60 = 188.
    compiled = compile_for(lambda x, y: x + y, spec((4096,)), spec((4096,)))
    step = _only_step(compiled)
    assert step.name == "add"
    assert step.op == "add"
    assert step.tiles == 16
    assert step.flops == 4096
    assert step.compute_cycles == 128 + 60
    assert step.exchange_cycles == 0
    assert step.exchange_bytes == 0
    assert step.sync_cycles == 90
    report = compiled.cost_report()
    assert device_cycles(report) == 188 + 0 + 90
    assert report.exchange_bytes == 0
    assert [lay.start for lay in compiled.program.input_layouts] == [0, 0]


def test_add_of_inputs_on_different_tiles_exchanges_one_block() -> None:
    # f32[256] on 16 tiles: at least 32 elements per tile, tiles used = min(16, 256 // 32) = 8,
    # block 256 / 8 = 32 elements. x is on tiles 0..7, so the next tensor starts at tile 8:
    # y is on tiles 8..15. The add follows x (tiles 0..7), so every tile of the add receives
    # y's block: 32 x 4 B = 128 B -> ceil(128 / 4) + 100 = 132 cycles; 8 tiles x 128 B = 1024 B
    # in all. Compute: 32 elements per tile, ceil(32 / 2) + 60 = 76.
    compiled = compile_for(lambda x, y: x + y, spec((256,)), spec((256,)))
    assert [(lay.start, lay.tiles) for lay in compiled.program.input_layouts] == [(0, 8), (8, 8)]
    step = _only_step(compiled)
    assert step.tiles == 8
    assert step.exchange_cycles == 32 + 100
    assert step.exchange_bytes == 8 * 128
    assert step.compute_cycles == 16 + 60
    assert step.sync_cycles == 90
    assert device_cycles(compiled.cost_report()) == 132 + 90 + 76


def test_exp_pays_for_transcendentals() -> None:
    # f32[4096] on 16 tiles: 256 elements per tile (as above); one FLOP and one transcendental
    # per element: ceil(256 / 2) + 256 x 4 + 60 = 128 + 1024 + 60 = 1212.
    step = _only_step(compile_for(jnp.exp, spec((4096,))))
    assert step.op == "exponential"
    assert step.compute_cycles == 1212
    assert step.exchange_cycles == 0
    assert step.sync_cycles == 90


def test_f16_add_uses_four_lanes() -> None:
    # f16[4096]: grain 8 / 2 = 4 elements, at least max(4, 128 / 2 = 64) per tile, tiles used
    # min(16, 4096 // 64) = 16, 256 elements each; both inputs on tiles 0..15.
    # Compute: ceil(256 / 4) + 60 = 124.
    step = _only_step(compile_for(lambda x, y: x + y, spec((4096,), F16), spec((4096,), F16)))
    assert step.tiles == 16
    assert step.compute_cycles == 64 + 60
    assert step.exchange_cycles == 0


def test_sum_reduces_in_two_stages() -> None:
    # jnp.sum of f32[4096] on 16 tiles: one kept row, depth 4096. The reduce rule tries spreading
    # the depth over gq = 1, 2, 4, 8, 16 tiles, costing stage one ceil(4096 / gq / 2) + 60 and,
    # for gq > 1, stage two (gq x 4 B) / 4 + 100 + 90 + ceil(gq / 2) + 60:
    #   gq=1: 2108; gq=2: 1084+102+90+61 = 1337; gq=4: 572+104+90+62 = 828;
    #   gq=8: 316+108+90+64 = 578; gq=16: 188+116+90+68 = 462  -> gq = 16.
    # Stage one ("local") on 16 tiles, 256 elements each: compute 128 + 60 = 188.
    # Stage two ("combine") on the output's single tile: receives 16 partials x 4 B = 64 B ->
    # 16 + 100 = 116 cycles exchange; adds 16 values: ceil(16 / 2) + 60 = 68; sync 90.
    report = compile_for(jnp.sum, spec((4096,))).cost_report()
    local, combine = device_steps(report)
    assert (local.name, combine.name) == ("reduce.local", "reduce.combine")
    assert local.tiles == 16
    assert local.compute_cycles == 188
    assert local.sync_cycles == 90
    assert local.flops == 4096  # one per input element
    assert combine.tiles == 1
    assert combine.exchange_cycles == 116
    assert combine.exchange_bytes == 64
    assert combine.compute_cycles == 68
    assert combine.sync_cycles == 90


# ---- matmul planning -----------------------------------------------------------------------


def _hand_cycles(
    t: ipujax.Target,
    size: tuple[int, int, int, int],
    split: tuple[int, ...],
    serial: int,
    item: int,
) -> tuple[int, int]:
    """The documented plan cost, written out again: exchange of both operand blocks + sync +
    AMP work + a compute set per extra serial chunk; a K split adds an exchange of k partial
    blocks (f32), a sync and their vector addition. Returns (cycles, temporary bytes)."""
    (batch, rows, cols, depth), (b, m, n, k) = size, split
    bb, mb, nb, kb = (-(-batch // b), -(-rows // m), -(-cols // n), -(-depth // k))
    received = (bb * mb * kb + bb * kb * nb) * item
    partials = bb * mb * nb * 4
    amp = t.amp_flops_per_cycle_half if item <= 2 else t.amp_flops_per_cycle_float
    cycles = (math.ceil(received / 4) + 100) + 90
    cycles += math.ceil(2 * bb * mb * nb * kb / amp) + 60 + (serial - 1) * 60
    if k > 1:
        cycles += math.ceil(k * partials / 4) + 100 + 90 + math.ceil(k * bb * mb * nb / 2) + 60
    temp = received // serial + partials * (2 if k > 1 else 1)
    return cycles, temp


def _hand_best(t: ipujax.Target, size: tuple[int, int, int, int], item: int) -> int:
    """The fewest cycles over power-of-two splits (and whole dims) that fit the budget."""
    tiles = t.tiles_per_ipu

    def options(s: int) -> set[int]:
        found = {p for p in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if p <= min(s, tiles)}
        return found | ({s} if s <= tiles else set())

    best = None
    for split in itertools.product(*(options(s) for s in size)):
        if math.prod(split) > tiles:
            continue
        kb = -(-size[3] // split[3])
        for serial in (s for s in (1, 2, 4, 8, 16) if kb % s == 0):
            cycles, temp = _hand_cycles(t, size, split, serial, item)
            if temp <= 0.6 * t.bytes_per_tile and (best is None or cycles < best):
                best = cycles
    assert best is not None
    return best


def test_matmul_plan_64_cubed_f32_on_16_tiles() -> None:
    t = target(16)
    plan = plan_matmul(1, 64, 64, 64, F32, 4, t)
    assert plan.tiles <= 16
    assert plan.temp_bytes_per_tile <= 383_385  # 0.6 x 638,976, rounded down
    cycles, temp = _hand_cycles(
        t, (1, 64, 64, 64), (plan.b, plan.m, plan.n, plan.k), plan.serial, 4
    )
    assert plan.cycles == cycles
    assert plan.temp_bytes_per_tile == temp
    assert plan.cycles == _hand_best(t, (1, 64, 64, 64), 4)


def test_matmul_plan_picks_the_split_worked_out_by_hand() -> None:
    # For 64x64x64 f32 on 16 tiles the 4 x 4 output grid (b=1, m=4, n=4, k=1, serial 1) gives
    # each tile a [16, 64] x [64, 16] block pair: received (16*64 + 64*16) x 4 = 8192 B ->
    # 2048 + 100 = 2148; sync 90; AMP 2*16*16*64 = 32768 FLOPs / 32 = 1024 + 60 = 1084.
    # 2148 + 90 + 1084 = 3322 cycles; temporaries 8192 + 16*16*4 = 9216 B per tile.
    plan = plan_matmul(1, 64, 64, 64, F32, 4, target(16))
    assert (plan.b, plan.m, plan.n, plan.k, plan.serial) == (1, 4, 4, 1, 1)
    assert plan.cycles == 3322
    assert plan.temp_bytes_per_tile == 9216


def test_matmul_program_costs_and_flops() -> None:
    # The compiled a @ b charges exactly the plan worked out above, as one superstep.
    compiled = compile_for(lambda a, b: a @ b, spec((64, 64)), spec((64, 64)))
    report = compiled.cost_report()
    dots = [s for s in report.supersteps if s.op == "dot_general"]
    assert sum(s.flops for s in dots) == 2 * 64 * 64 * 64
    (step,) = dots
    assert step.tiles == 16
    assert step.exchange_cycles == 2148
    assert step.sync_cycles == 90
    assert step.compute_cycles == 1084
    assert step.exchange_bytes == 16 * 8192
    assert device_cycles(report) == 3322
    assert report.flops == 2 * 64**3
    assert report.peak_flops_per_cycle == 32  # an f32 matmul program


def test_matmul_with_k_split_reduces_partials() -> None:
    # [8, 4096] x [4096, 8] f32 on 16 tiles: the K split over all 16 tiles (1, 1, 1, 16) gives
    # each tile [8, 256] x [256, 8]: received 2 x 2048 x 4 = 16384 B -> 4096 + 100 = 4196;
    # AMP 2*8*8*256 = 32768 / 32 + 60 = 1084. The partials (16 blocks of 8x8 f32, 4096 B) go to
    # the one output tile: 1024 + 100 = 1124 cycles; adding 16 x 64 values: 512 + 60 = 572.
    # Total 4196 + 90 + 1084 + 1124 + 90 + 572 = 7156.
    t = target(16)
    plan = plan_matmul(1, 8, 8, 4096, F32, 4, t)
    assert plan.cycles == _hand_best(t, (1, 8, 8, 4096), 4) == 7156
    assert (plan.b, plan.m, plan.n, plan.k) == (1, 1, 1, 16)
    report = compile_for(lambda a, b: a @ b, spec((8, 4096)), spec((4096, 8))).cost_report()
    matmul, reduce = device_steps(report)
    assert matmul.name == "dot_general.matmul"
    assert reduce.name == "dot_general.reduce_partials"
    assert matmul.flops == 2 * 8 * 8 * 4096
    assert (matmul.tiles, matmul.exchange_cycles, matmul.compute_cycles) == (16, 4196, 1084)
    assert (reduce.tiles, reduce.exchange_cycles, reduce.compute_cycles) == (1, 1124, 572)
    assert device_cycles(report) == 7156


def test_f16_matmul_plan_uses_the_fast_amp() -> None:
    t = target(16)
    plan = plan_matmul(1, 64, 64, 64, F16, 4, t)
    split = (plan.b, plan.m, plan.n, plan.k)
    assert (plan.cycles, plan.temp_bytes_per_tile) == _hand_cycles(
        t, (1, 64, 64, 64), split, plan.serial, 2
    )
    assert plan.cycles == _hand_best(t, (1, 64, 64, 64), 2)
    assert plan.cycles < plan_matmul(1, 64, 64, 64, F32, 4, t).cycles


def test_matmul_plan_stays_in_budget_when_large() -> None:
    # A [512, 4096] x [4096, 512] f32 matmul on 16 tiles cannot hold whole operands per tile
    # (the 4 x 4 output grid alone would need (128*4096*2) x 4 B = 4 MiB); the plan must split
    # K (over tiles or serially) to fit 383,385 B.
    t = target(16)
    plan = plan_matmul(1, 512, 512, 4096, F32, 4, t)
    assert plan.temp_bytes_per_tile <= 383_385
    assert plan.tiles <= 16
    split = (plan.b, plan.m, plan.n, plan.k)
    assert (plan.cycles, plan.temp_bytes_per_tile) == _hand_cycles(
        t, (1, 512, 512, 4096), split, plan.serial, 4
    )
    assert plan.cycles == _hand_best(t, (1, 512, 512, 4096), 4)


# ---- the report's totals -------------------------------------------------------------------


def _softmax(x: jnp.ndarray) -> jnp.ndarray:
    return jnp.exp(x - x.max(-1, keepdims=True)) / jnp.exp(x).sum(-1, keepdims=True)


def test_report_totals_are_the_sums_of_supersteps() -> None:
    report = compile_for(_softmax, spec((8, 64))).cost_report()
    steps = report.supersteps
    assert len(steps) > 3
    assert report.total_cycles == sum(
        s.compute_cycles + s.exchange_cycles + s.sync_cycles + s.link_cycles for s in steps
    )
    assert report.flops == sum(s.flops for s in steps)
    assert report.exchange_bytes == sum(s.exchange_bytes for s in device_steps(report))
    assert report.seconds == report.total_cycles / 1.85e9
    by_op = report.cycles_by_op()
    assert sum(c for _, c in by_op) == report.total_cycles
    assert [c for _, c in by_op] == sorted((c for _, c in by_op), reverse=True)
    assert {op for op, _ in by_op} == {s.op for s in steps}


def test_host_transfers_by_hand() -> None:
    # The aligned f32[4096] add returns no argument updated, so both arguments come from the
    # host and the sum goes back: 32,768 B in, 16,384 B out, each after 50,000 cycles of
    # latency at 7 GB/s (docs/target.md): 32,768 x 1.85e9 / 7e9 = 8,660.1 -> 8,661 cycles and
    # 16,384 x 1.85e9 / 7e9 = 4,330.1 -> 4,331.
    report = compile_for(lambda x, y: x + y, spec((4096,)), spec((4096,))).cost_report()
    first, *_, last = report.supersteps
    assert (first.name, first.kind, first.exchange_bytes) == ("host: inputs", "host", 32_768)
    assert first.link_cycles == 50_000 + 8_661
    assert (last.name, last.exchange_bytes, last.link_cycles) == ("host: outputs", 16_384, 54_331)
    assert report.host_bytes == 32_768 + 16_384
    assert report.total_cycles == 278 + 58_661 + 54_331
    assert report.time_split()["host"] == pytest.approx((58_661 + 54_331) / 1.85e9)


def test_state_the_program_returns_stays_on_the_device() -> None:
    # w is returned updated (same shape and dtype): it stays on the device; only x comes in
    # (64 x 4 = 256 B) and the loss goes out (4 B).
    def sgd(w, x):
        loss, g = jax.value_and_grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
        return w - 0.1 * g, loss

    report = compile_for(sgd, spec((64, 64)), spec((1, 64))).cost_report()
    first, *_, last = report.supersteps
    assert (first.exchange_bytes, last.exchange_bytes) == (256, 4)


def test_utilisation_by_hand() -> None:
    # The aligned f32[4096] add: 4096 FLOPs on 16 tiles whose f32 peak is 32 FLOP/cycle, in
    # 278 cycles on the IPU and 113,270 with the host transfers above: 4096 / (32 x 16 x 113,270).
    report = compile_for(lambda x, y: x + y, spec((4096,)), spec((4096,))).cost_report()
    assert report.flop_utilisation == pytest.approx(4096 / (32 * 16 * 113_270))
    assert report.seconds == pytest.approx(113_270 / 1.85e9)
    assert report.bytes_per_tile == BOW_BYTES_PER_TILE
    assert (report.tiles_per_ipu, report.ipus, report.clock_hz) == (16, 1, 1.85e9)


def test_mk1_clock_sets_seconds() -> None:
    mesh = ipujax.make_mesh((1,), ("ipu",), target=ipujax.Target.mk1().with_tiles(16))
    x = spec((4096,))
    report = ipujax.jit(lambda a, b: a + b, mesh=mesh).lower(x, x).compile().cost_report()
    assert report.target == "mk1"
    # The same vector rates and overheads as Bow: 188 + 0 + 90 = 278 cycles on the IPU, at
    # 1.6 GHz; the host transfers take as long in seconds, so more cycles.
    assert device_cycles(report) == 278
    assert report.seconds == report.total_cycles / 1.6e9

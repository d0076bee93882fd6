"""Host transfers as Graphcore's input pipelines run them (docs/target.md, "Host transfers
overlapped with compute"), derived by hand; and the IO tiles' streaming buffers as Poplar places
them, the phased report's fullest tile the same wherever it is shown.

A step of one iteration pays its transfers whole: nothing runs before it to hide its inputs
behind. A loop that reads its input a slice per trip (a scan over micro-batches, as a device
iterations or accumulation loop reads an infeed) has each later slice prefetched while the trip
before runs; the tiles still copy it on at the streaming rate, so a later trip pays
max(copy, transfer - the trip's cycles).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from partition_helpers import sgd_step, square_loss

import ipujax
import lowering
import partitioner

F32 = np.float32
# Bow (docs/target.md): 1.85 GHz; the host: 50,000 cycles a transfer, then 7e9 B/s on one IPU;
# streaming memory 16e9 B/s.
CLOCK, LATENCY, HOST_RATE, STREAM_RATE = 1.85e9, 50_000, 7e9, 16e9
TRIPS, BATCH, WIDTH = 4, 64, 512
SLICE = BATCH * WIDTH * 4  # one micro-batch: 131,072 B of f32


def _transfer(nbytes: int) -> int:
    return LATENCY + math.ceil(nbytes * CLOCK / HOST_RATE)


def _copy(nbytes: int) -> int:
    return math.ceil(nbytes * CLOCK / STREAM_RATE)


def one_batch(w, x):
    return jnp.tanh(x @ w).sum()


def micro_batches(w, xs):
    """The same work on each micro-batch of `xs`, a trip of a scan each, summed."""

    def body(total, x):
        return total + one_batch(w, x), None

    return jax.lax.scan(body, jnp.zeros((), F32), xs)[0]


def _built(fun, *shapes: tuple[int, ...]) -> partitioner.Built:
    specs = [jax.ShapeDtypeStruct(s, F32) for s in shapes]
    graph = lowering.eliminate_dead_code(lowering.lower(fun, *specs))
    mesh = partitioner.make_mesh((1,), ("ipu",), target=partitioner.Target.bow().with_tiles(16))
    options = partitioner.Options(resident_inputs=(0,))  # the weight stays on the IPU
    return partitioner.build(graph, mesh, (None,) * len(shapes), (None,), options)


def _compute(built: partitioner.Built) -> int:
    return sum(s.cycles for s in built.program.supersteps)


def test_one_iteration_pays_its_transfers_whole() -> None:
    """Nothing runs before the step's only micro-batch arrives, nor after its result leaves."""
    built = _built(one_batch, (WIDTH, WIDTH), (BATCH, WIDTH))
    sent, *_, returned = built.cost.supersteps
    assert sent.link_cycles == _transfer(SLICE) == 84_641  # 50,000 + 131,072 B at 7e9 B/s
    assert returned.link_cycles == _transfer(4)  # the f32 sum
    assert built.cost.total_cycles == sent.link_cycles + _compute(built) + returned.link_cycles
    assert built.cost.host is not None and built.cost.host.hidden_cycles == 0
    assert built.cost.notes == ()  # nothing hidden, nothing to say


def _trip(built: partitioner.Built) -> int:
    """The cycles of one trip of the program's loop."""
    (loop,) = [t for t in built.program.tasks if t.op.name == "while"]
    return sum(s.cycles for s in loop.supersteps) // TRIPS


def test_a_loop_prefetches_each_later_micro_batch_while_the_trip_before_runs() -> None:
    built = _built(micro_batches, (WIDTH, WIDTH), (TRIPS, BATCH, WIDTH))
    assert _trip(built) > _transfer(SLICE)  # compute-bound: each transfer hides behind a trip
    sent = built.cost.supersteps[0]
    assert sent.exchange_bytes == TRIPS * SLICE  # every micro-batch still crosses the link
    # The first micro-batch arrives before the loop; each later one is fetched while the trip
    # before runs and only its copy onto the tiles (131,072 B at 16e9 B/s) is charged.
    assert _copy(SLICE) == 15_156
    charged = _transfer(SLICE) + (TRIPS - 1) * _copy(SLICE)
    assert sent.link_cycles == charged == 130_109
    # Sent whole at the start, the four would cost 50,000 + 524,288 B at 7e9 B/s.
    assert _transfer(TRIPS * SLICE) == 188_562
    assert built.cost.host is not None
    assert built.cost.host.hidden_cycles == _transfer(TRIPS * SLICE) - charged == 58_453
    # The step: the first transfer, then a trip and a copy each, then the result.
    assert built.cost.total_cycles == charged + _compute(built) + _transfer(4)
    (note,) = built.cost.notes
    assert "58,453 of the transfers'" in note and f"{charged + _transfer(4):,} charged" in note


def test_a_trip_shorter_than_its_transfer_pays_what_the_host_link_cannot_deliver() -> None:
    """Host-bound: a narrow matmul a trip on a large micro-batch (524,288 B); a later trip pays
    transfer - trip (188,562 - 109,015 cycles), more than its copy (60,621)."""
    width, batch = 32, 4096
    piece = batch * width * 4
    built = _built(micro_batches, (width, width), (TRIPS, batch, width))
    trip = _trip(built)
    assert LATENCY < trip < _transfer(piece) - _copy(piece)
    charged = _transfer(piece) + (TRIPS - 1) * (_transfer(piece) - trip)
    assert built.cost.supersteps[0].link_cycles == charged
    assert built.cost.host is not None
    assert built.cost.host.hidden_cycles == _transfer(TRIPS * piece) - charged


def test_trips_shorter_than_the_latency_are_sent_whole_at_the_start() -> None:
    """Each prefetched slice would pay more than the latency it saves: one transfer is cheaper."""
    width, batch = 64, 256
    built = _built(micro_batches, (width, width), (TRIPS, batch, width))
    assert _trip(built) < LATENCY
    assert built.cost.supersteps[0].link_cycles == _transfer(TRIPS * batch * width * 4)
    assert built.cost.host is not None and built.cost.host.hidden_cycles == 0


def test_the_report_says_what_was_hidden_and_what_charged() -> None:
    w = jax.ShapeDtypeStruct((WIDTH, WIDTH), F32)
    xs = jax.ShapeDtypeStruct((TRIPS, BATCH, WIDTH), F32)
    mesh = ipujax.make_mesh((1,), ("ipu",), target=ipujax.Target.bow().with_tiles(16))
    jitted = ipujax.jit(micro_batches, mesh=mesh, resident_argnums=0)
    report = jitted.lower(w, xs).compile().cost_report()
    (line,) = [c for c in report.caveats if c.startswith("host:")]
    assert "58,453 of the transfers'" in line and "3 later trips" in line


# ---- phased: the IO tiles ----------------------------------------------------------------------


def _phased_report(fun, target: ipujax.Target, *args) -> ipujax.CostReport:
    mesh = ipujax.make_mesh((1,), ("ipu",), target=target)
    compiled = ipujax.jit(fun, mesh=mesh, phases="auto").lower(*args).compile()
    want = jax.jit(fun)(*args)
    for got, ref in zip(jax.tree.leaves(compiled(*args)), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=2e-5, atol=1e-6)
    return compiled.cost_report()


def test_io_tiles_load_the_batch_before_the_first_phase_and_send_the_loss_behind_the_rest() -> None:
    """The first phase reads the batch: nothing computes before it, so its transfer is charged
    whole; the loss, made in the last forward phase, leaves while the backward phases run."""
    rng = np.random.default_rng(0)
    ws = [(0.05 * rng.standard_normal((256, 256))).astype(F32) for _ in range(4)]
    x = rng.standard_normal((8, 256)).astype(F32)
    target = dataclasses.replace(ipujax.Target.bow().with_tiles(16), io_tiles=2)
    report = _phased_report(sgd_step, target, ws, x)
    sent, *_, returned = report.supersteps
    assert sent.exchange_bytes == 8 * 256 * 4 and sent.link_cycles == _transfer(8_192)
    assert returned.exchange_bytes == 4 and returned.link_cycles == 0


# A 12-layer MLP of 256 x 256 f32 weights (262,144 B each) trained with clipped Adam, phased on a
# 32-tile IPU of 65,536 B tiles: 4 IO tiles (an eighth), 28 computing.
OPTIMIZER = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
SMALL_TILES = dataclasses.replace(ipujax.Target.bow().with_tiles(32), bytes_per_tile=65_536)


def mlp12_step(ws, state, x):
    loss, grads = jax.value_and_grad(square_loss)(ws, x)
    updates, state = OPTIMIZER.update(grads, state, ws)
    return optax.apply_updates(ws, updates), state, loss


@pytest.fixture(scope="module")
def mlp12_report() -> ipujax.CostReport:
    rng = np.random.default_rng(1)
    ws = [(0.03 * rng.standard_normal((256, 256))).astype(F32) for _ in range(12)]
    x = rng.standard_normal((8, 256)).astype(F32)
    return _phased_report(mlp12_step, SMALL_TILES, ws, OPTIMIZER.init(ws), x)


def test_a_weight_too_large_for_two_on_the_io_tiles_streams_in_pieces(mlp12_report) -> None:
    """Two whole weights on 4 IO tiles would be 131,072 B a tile, twice the budget: the weight
    streams in 2 pieces of 131,072 B, two in flight, 65,536 B an IO tile, and the step fits."""
    report = mlp12_report
    io = report.tile_memory[0, 28:]
    assert io.tolist() == [2 * (262_144 // 2) // 4] * 4 == [65_536] * 4
    assert report.fits
    (line,) = [c for c in report.caveats if c.startswith("IO tiles:")]
    assert "2 pieces of 131,072 B" in line


def test_the_fullest_tile_is_the_same_in_the_summary_the_tables_and_the_phases(
    mlp12_report,
) -> None:
    for report in (mlp12_report, _four_layers_on_16_tiles()):
        fullest = report.top_tiles[0]
        assert fullest.bytes == report.peak_tile_bytes == int(report.tile_memory.max())
        assert fullest.tile == int(report.tile_memory[0].argmax())
        assert max(p.peak_tile_bytes for p in report.phases) == report.peak_tile_bytes
        assert sum(size for _, size in fullest.categories) == fullest.bytes


def _four_layers_on_16_tiles() -> ipujax.CostReport:
    """The compute tiles fuller than the IO tiles: 2 IO tiles of 638,976 B hold two weights."""
    rng = np.random.default_rng(0)
    ws = [(0.05 * rng.standard_normal((256, 256))).astype(F32) for _ in range(4)]
    x = rng.standard_normal((8, 256)).astype(F32)
    target = dataclasses.replace(ipujax.Target.bow().with_tiles(16), io_tiles=2)
    return _phased_report(sgd_step, target, ws, x)

"""IPU-Link costs derived by hand from docs/target.md: 15.75 GB/s x 0.85 per IPU-Link, both ways
round a ring over the links its slowest hop has, 3,000 cycles per ring step, Gateway-Links
beyond a Pod64 (2 x 12.5 GB/s x 0.85 per 4-IPU machine), global sync of 15 ns per hop there and
back with 1 + N/4 hops; where mesh axes sit among the physical IPUs. The topologies themselves
are worked through in test_links_by_hand.py."""

from __future__ import annotations

import dataclasses
import math
import re
from fractions import Fraction

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P
from partition_helpers import collectives, compile_sharded, ffn, ffn_args, mesh

import ipujax
from partitioner.cost.exchange import global_sync_cycles
from partitioner.cost.links import LinkModel, link_cycles, ring_bytes, ring_bytes_per_second
from partitioner.cost.topology import RingPath
from partitioner.mesh import system_for
from partitioner.target import Target

MACHINE = "IPU-Links within a machine"
POD16 = "IPU-Links within a Pod16"
POD64 = "IPU-Links within a Pod64"
GATEWAY_ROUTE = "Gateway-Links between Pod64s"

LINK = Fraction(15_750_000_000) * Fraction(85, 100)  # usable bytes/s each way per IPU-Link
GATEWAY = Fraction(2 * 100 * 10**9, 8 * 4) * Fraction(85, 100)  # 2 x 100 Gb/s per 4 IPUs, 85%
LATENCY = 3000


def _hand_link_cycles(bytes_: int, steps: int, links: float, clock: int) -> int:
    """`links` per hop in each direction, both ways round the ring; 0 for Gateway-Links."""
    rate = GATEWAY if links == 0 else 2 * Fraction(links) * LINK
    return math.ceil(Fraction(bytes_) * clock / rate) + steps * LATENCY


# ---- Target's link constants and formulas --------------------------------------------------------


def test_link_constants() -> None:
    bow = Target.bow()
    assert bow.ipu_link_bytes_per_second == 15.75e9
    assert bow.ipu_link_efficiency == 0.85
    assert (bow.rung_links, bow.cross_links, bow.column_links) == (4, 2, 2)  # + 2 down = 10
    assert bow.collective_rings == 2
    assert bow.ipu_link_latency_cycles == 3000
    assert bow.gateway_link_bytes_per_second == 12.5e9
    assert (bow.gateway_links_per_machine, bow.gateway_link_efficiency) == (2, 0.85)


def test_ring_rates_by_hand() -> None:
    bow, pod64 = Target.bow(), system_for(64)
    # Two links each way: 4 x 15.75e9 x 0.85 = 53.55e9 bytes/s; one: 26.775e9.
    assert ring_bytes_per_second(bow, pod64, RingPath(POD64, 2.0)) == pytest.approx(53.55e9)
    assert ring_bytes_per_second(bow, pod64, RingPath(POD64, 1.0)) == pytest.approx(26.775e9)
    # Gateway: 2 x 12.5e9 x 0.85 / 4 IPUs = 5.3125e9 bytes/s per IPU.
    assert ring_bytes_per_second(bow, pod64, RingPath(GATEWAY_ROUTE, 0.0)) == 5.3125e9


def test_link_cycles_by_hand_examples() -> None:
    bow = Target.bow()  # 1.85 GHz
    # 1000 B at 53.55e9: 1000 x 1.85e9 / 53.55e9 = 34.5 -> 35 cycles, plus 2 steps x 3000.
    assert link_cycles(bow, 1000, 2, 53.55e9) == 35 + 6000
    # Over the Gateway: 1000 x 1.85e9 / 5.3125e9 = 348.2 -> 349.
    assert link_cycles(bow, 1000, 2, 5.3125e9) == 349 + 6000
    # 1 MiB in one step at 26.775e9: 2^20 x 1.85e9 / 26.775e9 = 72,450.9 -> 72,451.
    assert link_cycles(bow, 2**20, 1, 26.775e9) == 72_451 + 3000
    assert link_cycles(bow, 0, 7, 53.55e9) == 0  # nothing sent, nothing to wait for


@pytest.mark.parametrize("bytes_", [1, 4, 768, 4096, 123_457, 10**7])
@pytest.mark.parametrize("steps", [1, 6, 14])
@pytest.mark.parametrize("links", [0.0, 0.5, 1.0, 2.0])
def test_link_cycles_formula(bytes_: int, steps: int, links: float) -> None:
    route = GATEWAY_ROUTE if links == 0 else POD64
    for target, clock in ((Target.bow(), 1_850_000_000), (Target.mk1(), 1_600_000_000)):
        expected = _hand_link_cycles(bytes_, steps, links, clock)
        rate = ring_bytes_per_second(target, system_for(256), RingPath(route, links))
        assert link_cycles(target, bytes_, steps, rate) == expected


@pytest.mark.parametrize("ipus,cycles", [(2, 48), (4, 96), (16, 240), (64, 816)])
def test_global_sync_cycles_by_hand(ipus: int, cycles: int) -> None:
    mk1 = Target.mk1()
    assert mk1.clock_hz == 1.6e9
    assert global_sync_cycles(mk1, ipus) == cycles
    # The formula, not the table: twice the hop time, or twice the clock, twice the cycles.
    slower_hops = dataclasses.replace(mk1, global_sync_hop_seconds=30e-9)
    faster_clock = dataclasses.replace(mk1, clock_hz=3.2e9)
    assert global_sync_cycles(slower_hops, ipus) == 2 * cycles
    assert global_sync_cycles(faster_clock, ipus) == 2 * cycles


def test_global_sync_hops_grow_every_four_ipus() -> None:
    mk1 = Target.mk1()
    # hops = 1 + N // 4; 48 cycles per hop at 1.6 GHz.
    assert [global_sync_cycles(mk1, n) for n in (2, 3, 4, 7, 8, 128, 256)] == [
        48,
        48,
        96,
        96,
        144,
        48 * 33,
        48 * 65,
    ]


# ---- ring closed forms ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
@pytest.mark.parametrize("group", [1, 2, 3, 4, 8, 64])
@pytest.mark.parametrize("buffer", [4, 10, 1000, 4096])
def test_ring_bytes(kind: str, group: int, buffer: int) -> None:
    sent, steps = ring_bytes(kind, buffer, group)
    if group == 1:
        assert (sent, steps) == (0, 0)
    elif kind == "all_reduce":  # 2 (n-1)/n N in 2 (n-1) steps
        assert (sent, steps) == (
            math.ceil(Fraction(2 * (group - 1) * buffer, group)),
            2 * group - 2,
        )
    else:  # (n-1)/n N in n-1 steps
        assert (sent, steps) == (math.ceil(Fraction((group - 1) * buffer, group)), group - 1)


def test_ring_bytes_examples() -> None:
    assert ring_bytes("all_reduce", 1000, 4) == (1500, 6)
    assert ring_bytes("all_gather", 1000, 4) == (750, 3)
    assert ring_bytes("reduce_scatter", 1000, 4) == (750, 3)
    assert ring_bytes("all_to_all", 1000, 4) == (750, 3)
    assert ring_bytes("all_reduce", 10, 3) == (14, 4)  # 40/3 rounded up


# ---- where mesh axes sit: LinkModel --------------------------------------------------------------


def test_place_lays_the_mesh_out_in_its_order_last_axis_innermost() -> None:
    """As a jax.sharding.Mesh lies on its devices: the last axis varies fastest."""
    model = LinkModel.place({"dp": 4, "tp": 4}, Target.bow())
    assert model.placement == ("tp", "dp")
    assert (model.stride("tp"), model.stride("dp")) == (1, 4)
    assert model.route(["tp"]) == MACHINE
    assert model.span(["dp"]) == 13 and model.route(["dp"]) == POD16  # 16 IPUs: a Pod16
    assert LinkModel.place({"tp": 4, "dp": 4}, Target.bow()).placement == ("dp", "tp")


def test_graphcores_gpt3_mapping_on_a_pod256() -> None:
    """docs/phases.md: dp 4 x tp1 8 x tp2 8 puts each tp2 group on two neighbouring machines,
    each tp1 group of 8 at a stride of 8 inside a Pod64, and the replicas in the 4 Pod64s."""
    model = LinkModel.place({"dp": 4, "tp1": 8, "tp2": 8}, Target.bow())
    assert (model.stride("tp2"), model.stride("tp1"), model.stride("dp")) == (1, 8, 64)
    assert model.span(["tp2"]) == 8 and model.route(["tp2"]) == POD64
    assert model.span(["tp1"]) == 57 and model.route(["tp1"]) == POD64
    assert model.route(["dp"]) == GATEWAY_ROUTE


@pytest.mark.parametrize("shape", [(4, 64), (64, 4)])
def test_routes_of_a_256_ipu_mesh(shape: tuple[int, int]) -> None:
    model = LinkModel.place(dict(zip(("a", "b"), shape, strict=True)), Target.bow())
    inner, outer = shape[1], shape[0]
    assert model.placement == ("b", "a")
    # The inner axis: consecutive IPUs, inside a machine if 4, a whole Pod64 if 64.
    assert model.route(["b"]) == (MACHINE if inner == 4 else POD64)
    # The outer axis strides over the inner one and leaves the Pod64.
    assert model.span(["a"]) == 1 + (outer - 1) * inner
    assert model.route(["a"]) == GATEWAY_ROUTE
    assert model.span(["a", "b"]) == 256
    assert model.route(["a", "b"]) == GATEWAY_ROUTE


def test_route_boundaries() -> None:
    cases = ((2, MACHINE), (4, MACHINE), (5, POD16), (16, POD16), (17, POD64), (64, POD64))
    for n, route in (*cases, (65, GATEWAY_ROUTE)):
        assert LinkModel.place({"x": n}, Target.bow()).route(["x"]) == route


def test_link_model_ring_over_the_gateway() -> None:
    bow = Target.bow()
    model = LinkModel.place({"b": 64, "a": 4}, bow)
    cost = model.ring("all_reduce", ["b"], 4096)
    # 16 IPUs of the group in each of 4 Pod64s, run level by level: a reduce-scatter round
    # each Pod64's ring of 16 (15/16 x 4096 = 3,840 bytes, 15 steps, 2 links each way), an
    # all-reduce of the 256-byte shards across the Pod64s (2 x 3/4 x 256 = 384, 6 steps), an
    # all-gather inside: the bytes of one flat ring of 64, in 36 steps rather than 126.
    assert (cost.bytes_per_ipu, cost.steps) == (math.ceil(2 * 63 * 4096 / 64), 36)
    assert cost.route == f"{POD64}, then {GATEWAY_ROUTE}"
    inner = _hand_link_cycles(3840, 15, 2, 1_850_000_000)
    outer = _hand_link_cycles(384, 6, 0, 1_850_000_000)
    assert cost.link_cycles == 2 * inner + outer
    assert cost.sync_cycles == global_sync_cycles(bow, 64)
    # The 4 IPUs of a machine: a ring 0-1-3-2 whose cross hops have 2 links each way.
    inside = model.ring("all_gather", ["a"], 4096)
    assert (inside.bytes_per_ipu, inside.steps, inside.route) == (3072, 3, MACHINE)
    assert inside.link_cycles == _hand_link_cycles(3072, 3, 2, 1_850_000_000)
    assert inside.sync_cycles == global_sync_cycles(bow, 4)


# ---- the report's collectives cost link cycles plus a global sync of their group -----------------


def _route(why: str) -> str:
    match = re.search(r"over ((IPU|Gateway)-Links[^;]*)$", why)
    assert match, why
    return match.group(1)


def _check_collective_cycles(compiled: ipujax.Compiled, links: dict[str, float]) -> list[str]:
    """Each collective's cycles from the links per direction its route has (`links`, by route,
    worked out by hand in the callers), and the routes in order."""
    target = compiled.mesh.target
    routes = []
    found = collectives(compiled)
    assert found
    for cost, op in found:
        n = cost.group_size
        steps = 2 * (n - 1) if op.name == "all_reduce" else n - 1
        route = _route(cost.why)
        link = _hand_link_cycles(cost.bytes_per_ipu, steps, links[route], int(target.clock_hz))
        assert cost.cycles == link + global_sync_cycles(target, n)
        routes.append(route)
    return routes


def test_report_cycles_of_a_two_d_ffn() -> None:
    # tp2 (size 4) moves more bytes, so it sits inside a machine; tp1 strides by 4 IPUs.
    # On a Pod16: tp2 is a whole machine, its ring 0-1-3-2 has 2 links per hop each way; tp1
    # pairs an IPU with the same IPU of the machine above, {0, 4}: one hop of 2 column links,
    # which both directions of a ring of two share, 1 each.
    specs = (P(None, "tp2"), P("tp2", "tp1"), P("tp1", "tp2"))
    the_mesh = mesh((2, 4), ("tp1", "tp2"))
    compiled = compile_sharded(ffn, the_mesh, ffn_args(16, 8), specs)
    routes = _check_collective_cycles(compiled, {MACHINE: 2, POD16: 1})
    axes = [cost.axes for cost in compiled.cost_report().collectives]
    assert dict(zip(axes, routes, strict=True)) == {("tp2",): MACHINE, ("tp1",): POD16}


def test_report_cycles_of_a_data_parallel_sum_over_two_pod64s() -> None:
    # 128 IPUs, 64 in each of two Pod64s: GCL runs the sum's all-reduce of 4 bytes level by
    # level: a reduce-scatter round each Pod64's ring (63/64 x 4 -> 4 bytes, 63 steps at
    # 53.55e9: 1 + 189,000 cycles), an all-reduce of the 1-byte shard across the two Pod64s
    # (1 byte, 2 steps at 5.3125e9: 1 + 6,000), an all-gather inside (189,001 again).
    x = jax.ShapeDtypeStruct((256, 8), jnp.float32)
    compiled = compile_sharded(jnp.sum, mesh((128,), ("dp",)), (x,), (P("dp"),))
    (cost,) = compiled.cost_report().collectives
    assert _route(cost.why) == f"{POD64}, then {GATEWAY_ROUTE}"
    assert (cost.kind, cost.group_size, cost.bytes_per_ipu) == ("all_reduce", 128, 4 + 1 + 4)
    target = compiled.mesh.target
    assert cost.cycles == 2 * 189_001 + 6_001 + global_sync_cycles(target, 128)


@pytest.mark.parametrize("ipus,route", [(4, MACHINE), (8, POD16)])
def test_report_cycles_of_a_data_parallel_sum(ipus: int, route: str) -> None:
    # 4: one machine's ring, 2 links per hop each way; 8: two machines of a Pod16, a block
    # whose ring goes up one column and down another, 2 links per hop each way.
    x = jax.ShapeDtypeStruct((2 * ipus, 8), jnp.float32)
    compiled = compile_sharded(jnp.sum, mesh((ipus,), ("dp",)), (x,), (P("dp"),))
    links = {MACHINE: 2.0, POD16: 2.0, GATEWAY_ROUTE: 0.0}
    assert _check_collective_cycles(compiled, links) == [route]
    (cost,) = compiled.cost_report().collectives
    assert (cost.kind, cost.group_size, cost.bytes_per_ipu) == (
        "all_reduce",
        ipus,
        math.ceil(2 * (ipus - 1) * 4 / ipus),
    )


def test_the_summary_gives_the_collectives_by_route() -> None:
    """Each route's collectives, counted and timed: a sum over two Pod64s runs level by
    level."""
    x = jax.ShapeDtypeStruct((256, 8), jnp.float32)
    compiled = compile_sharded(jnp.sum, mesh((128,), ("dp",)), (x,), (P("dp"),))
    report = compiled.cost_report()
    ((route, count, cycles),) = report.collectives_by_route()
    assert (route, count) == (f"{POD64}, then {GATEWAY_ROUTE}", 1)
    assert cycles == report.collectives[0].cycles
    line = f"collectives     1 over {route}, {cycles / report.clock_hz * 1e3:.4f} ms"
    assert line in report.summary().splitlines()

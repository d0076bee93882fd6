"""Ring collectives over the topologies of docs/target.md ("IPU-Links and systems"), each
expected figure worked out by hand from the published numbers, not by calling the model:

- an IPU-Link carries 15.75 GB/s raw each way (Graphcore's GPT-3 slide), 0.85 of it usable
  (PopLibs' multi-IPU model): 15.75e9 x 0.85 = 13.3875e9 bytes/s;
- per IPU, 4 links to its pair partner, 2 across to the machine's other pair, 2 up and 2 down
  the column of machines (Poplar's IPU Model); a Pod16's column is open (a ladder), a Pod64's
  closes into a ring (the 2D torus);
- GCL sends half the data each way round a ring and runs at most two rings (its
  quad-directional ring): at most 2 links per hop in each direction;
- a Gateway-Link carries 12.5 GB/s raw (100 Gb/s), two per 4-IPU machine, 0.85 usable:
  2 x 12.5e9 x 0.85 / 4 = 5.3125e9 bytes/s per IPU;
- 3,000 cycles per ring step; Bow's clock is 1.85 GHz.

A ring AllReduce of an N-byte buffer over n IPUs sends 2 (n-1)/n N bytes per IPU in 2 (n-1)
steps; a ReduceScatter (n-1)/n N in n-1 steps.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from partitioner.cost.links import LinkModel, Ring
from partitioner.target import Target

BOW = Target.bow()


def _ring(sizes: dict[str, int], kind: str, axis: str, buffer: int) -> Ring:
    return LinkModel.place(sizes, BOW).ring(kind, [axis], buffer)


# ---- ladders: a machine and a Pod16 --------------------------------------------------------------


def test_all_reduce_over_the_four_ipus_of_a_machine() -> None:
    # The machine is a ladder of two rungs, a ring 0-1-3-2: the rungs 0-1 and 3-2 have 4 links,
    # the cross hops 1-3 and 2-0 have 2. The slowest hop has 2 links each way, and GCL's two
    # rings use both: 2 x 2 x 13.3875e9 = 53.55e9 bytes/s per IPU.
    # N = 1,000,000: 2 x 3/4 x 1e6 = 1,500,000 bytes in 6 steps.
    # 1.5e6 x 1.85e9 / 53.55e9 = 51,820.7 -> 51,821 cycles, + 6 x 3,000 = 69,821.
    ring = _ring({"x": 4}, "all_reduce", "x", 1_000_000)
    assert (ring.bytes_per_ipu, ring.steps) == (1_500_000, 6)
    assert ring.route == "IPU-Links within a machine"
    assert ring.links_per_direction == 2
    assert ring.link_cycles == 69_821


def test_all_reduce_over_a_pod16() -> None:
    # 16 IPUs, 4 machines: a block of 4 positions x 4 rows. Its ring goes up one column and
    # down the next, crossing each machine on its rungs and cross links, so it never goes back
    # over its own links: the slowest hops (column and cross) have 2 links each way.
    # 53.55e9 bytes/s. N = 1,000,000: 2 x 15/16 x 1e6 = 1,875,000 bytes in 30 steps.
    # 1.875e6 x 1.85e9 / 53.55e9 = 64,775.9 -> 64,776, + 30 x 3,000 = 154,776.
    ring = _ring({"x": 16}, "all_reduce", "x", 1_000_000)
    assert (ring.bytes_per_ipu, ring.steps) == (1_875_000, 30)
    assert ring.route == "IPU-Links within a Pod16"
    assert ring.links_per_direction == 2
    assert ring.link_cycles == 154_776


def test_all_reduce_up_a_pod16_column() -> None:
    # dp 4 x tp 4 on a Pod16: each dp group is one IPU position in the 4 machines, {0, 4, 8,
    # 12}. The column is open (a ladder), so the ring goes up 0-4-8-12 and comes back down over
    # the same column links: each direction of those 2 links carries both ways of the ring, 1
    # link each. 2 x 1 x 13.3875e9 = 26.775e9 bytes/s.
    # N = 1,000,000: 1,500,000 bytes in 6 steps. 1.5e6 x 1.85e9 / 26.775e9 = 103,641.5 ->
    # 103,642, + 6 x 3,000 = 121,642.
    ring = _ring({"dp": 4, "tp": 4}, "all_reduce", "dp", 1_000_000)
    assert ring.route == "IPU-Links within a Pod16"
    assert ring.links_per_direction == 1
    assert ring.link_cycles == 121_642


# ---- the Pod64 torus -----------------------------------------------------------------------------


def test_all_reduce_round_a_pod64_torus_column() -> None:
    # col 16 x pos 4 on a Pod64: each col group is one IPU position in all 16 machines, a whole
    # column of the torus, which closes: the ring goes round once and each column link carries
    # one stream each way. 2 links each way: 53.55e9 bytes/s.
    # N = 1,600,000: 2 x 15/16 x 1.6e6 = 3,000,000 bytes in 30 steps.
    # 3e6 x 1.85e9 / 53.55e9 = 103,641.5 -> 103,642, + 30 x 3,000 = 193,642.
    ring = _ring({"col": 16, "pos": 4}, "all_reduce", "col", 1_600_000)
    assert (ring.bytes_per_ipu, ring.steps) == (3_000_000, 30)
    assert ring.route == "IPU-Links within a Pod64"
    assert ring.links_per_direction == 2
    assert ring.link_cycles == 193_642


def test_gpt3_tp1_groups_share_their_torus_column() -> None:
    # dp 4 x tp1 8 x tp2 8 on a Pod256 (Graphcore's GPT-3): a tp1 group is {0, 8, ..., 56},
    # position 0 of every other machine; the group {4, 12, ..., 60} takes the machines between,
    # on the same column. Both go round the closed column, so each column link carries one
    # stream each way of each group: 2 links / 2 groups = 1 link each way.
    # 26.775e9 bytes/s. N = 800,000: 2 x 7/8 x 8e5 = 1,400,000 bytes in 14 steps.
    # 1.4e6 x 1.85e9 / 26.775e9 = 96,732.0 -> 96,733, + 14 x 3,000 = 138,733.
    ring = _ring({"dp": 4, "tp1": 8, "tp2": 8}, "all_reduce", "tp1", 800_000)
    assert (ring.bytes_per_ipu, ring.steps) == (1_400_000, 14)
    assert ring.route == "IPU-Links within a Pod64"
    assert ring.links_per_direction == 1
    assert ring.link_cycles == 138_733


def test_gpt3_tp2_groups_are_blocks_of_two_machines() -> None:
    # A tp2 group is IPUs 0-7, two machines: a block whose ring crosses both machines and
    # comes back down the other column; 2 links each way, 53.55e9 bytes/s.
    # N = 800,000: 1,400,000 bytes in 14 steps. 1.4e6 x 1.85e9 / 53.55e9 = 48,366.0 -> 48,367,
    # + 14 x 3,000 = 90,367.
    ring = _ring({"dp": 4, "tp1": 8, "tp2": 8}, "all_reduce", "tp2", 800_000)
    assert ring.links_per_direction == 2
    assert ring.link_cycles == 90_367


POD64_ROUTE = "IPU-Links within a Pod64"


# ---- Gateway-Links between Pod64s ----------------------------------------------------------------


def test_reduce_scatter_between_pod64s() -> None:
    # The GPT-3 mesh's dp groups are one IPU in each of the 4 Pod64s: over Gateway-Links,
    # 5.3125e9 bytes/s per IPU. N = 4,000,000: 3/4 x 4e6 = 3,000,000 bytes in 3 steps.
    # 3e6 x 1.85e9 / 5.3125e9 = 1,044,705.9 -> 1,044,706, + 3 x 3,000 = 1,053,706.
    ring = _ring({"dp": 4, "tp1": 8, "tp2": 8}, "reduce_scatter", "dp", 4_000_000)
    assert (ring.bytes_per_ipu, ring.steps) == (3_000_000, 3)
    assert ring.route == "Gateway-Links between Pod64s"
    assert ring.link_cycles == 1_053_706


def test_an_all_reduce_over_a_pod64s_torus() -> None:
    # dp=64 fills a Pod64: one ring of 64 round the torus, 2 links each way, 53.55e9 bytes/s.
    # N = 4,000,000: 2 x 63/64 x 4e6 = 7,875,000 bytes in 126 steps.
    # 7.875e6 x 1.85e9 / 53.55e9 = 272,058.8 -> 272,059, + 126 x 3,000 = 650,059.
    ring = _ring({"dp": 64}, "all_reduce", "dp", 4_000_000)
    assert (ring.bytes_per_ipu, ring.steps, ring.route) == (7_875_000, 126, POD64_ROUTE)
    assert ring.link_cycles == 650_059


def test_an_all_reduce_over_a_pod256_runs_level_by_level() -> None:
    # dp=256: 64 IPUs in each of 4 Pod64s. GCL's hierarchy: reduce-scatter inside each Pod64
    # (63/64 x 4e6 = 3,937,500 bytes, 63 steps at 53.55e9: 136,029.4 -> 136,030 + 189,000 =
    # 325,030), all-reduce each 62,500-byte shard across the 4 Pod64s over the Gateway-Links
    # (2 x 3/4 x 62,500 = 93,750 bytes, 6 steps at 5.3125e9: 32,647.1 -> 32,648 + 18,000 =
    # 50,648), all-gather inside (325,030 again): 700,708 cycles, where one flat ring of 256
    # at the Gateway-Links' rate would take 2,775,000 + 510 x 3,000.
    ring = _ring({"dp": 256}, "all_reduce", "dp", 4_000_000)
    assert (ring.bytes_per_ipu, ring.steps) == (2 * 3_937_500 + 93_750, 63 + 6 + 63)
    assert ring.route == f"{POD64_ROUTE}, then Gateway-Links between Pod64s"
    assert ring.link_cycles == 325_030 + 50_648 + 325_030


def test_a_reduce_scatter_and_an_all_gather_over_a_pod256() -> None:
    # The first two levels, and the last two in the other order: 325,030 + 4 x 62,500 x 3/4 =
    # 46,875 bytes in 3 steps (16,323.5 -> 16,324 + 9,000 = 25,324); the all-gather's buffer
    # is the gathered whole, its outer level gathers the 62,500-byte shards.
    scatter = _ring({"dp": 256}, "reduce_scatter", "dp", 4_000_000)
    gather = _ring({"dp": 256}, "all_gather", "dp", 4_000_000)
    assert scatter.link_cycles == gather.link_cycles == 325_030 + 25_324
    assert scatter.bytes_per_ipu == gather.bytes_per_ipu == 3_937_500 + 46_875


# ---- properties ----------------------------------------------------------------------------------

POWERS = [2**k for k in range(9)]  # GCL's replica counts are powers of two
KINDS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]


@st.composite
def strided_groups(draw: st.DrawFn) -> tuple[int, int, int]:
    """(system size, group size n, stride s) with n x s within the system."""
    total = draw(st.sampled_from([4, 16, 64, 256]))
    n = draw(st.sampled_from([p for p in POWERS if 2 <= p <= total]))
    s = draw(st.sampled_from([p for p in POWERS if n * p <= total]))
    return total, n, s


def _strided_ring(total: int, n: int, s: int, kind: str, buffer: int) -> Ring:
    """The group of n IPUs at stride s of a mesh filling a system of `total` IPUs."""
    return _ring({"outer": total // (n * s), "g": n, "inner": s}, kind, "g", buffer)


@settings(max_examples=200, deadline=None)
@given(strided_groups(), st.sampled_from(KINDS), st.integers(0, 10**9), st.integers(0, 10**9))
def test_cycles_grow_with_bytes(group: tuple[int, int, int], kind: str, a: int, b: int) -> None:
    small, large = sorted((a, b))
    total, n, s = group
    assert (
        _strided_ring(total, n, s, kind, small).link_cycles
        <= _strided_ring(total, n, s, kind, large).link_cycles
    )


@settings(max_examples=200, deadline=None)
@given(strided_groups(), st.sampled_from(KINDS), st.integers(1, 10**9))
def test_a_group_never_gets_faster_by_spanning_more(
    group: tuple[int, int, int], kind: str, buffer: int
) -> None:
    """The same group size and bytes, spread over more of the same system (twice the stride,
    and so on out to the Gateway-Links), is never charged fewer cycles while it is one ring;
    a group GCL runs level by level across Pod64s takes fewer ring steps than one ring of all
    its IPUs (`test_an_all_reduce_over_a_pod256_runs_level_by_level`)."""
    total, n, s = group
    cycles = _strided_ring(total, n, s, kind, buffer).link_cycles
    wider = s * 2
    while n * wider <= total:
        ring = _strided_ring(total, n, wider, kind, buffer)
        if ", then " not in ring.route:
            assert ring.link_cycles >= cycles
        wider *= 2

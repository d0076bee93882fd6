"""Tile rules: how each op runs on tiles. One rule per op of the vocabulary.

A rule maps an op onto tiles and returns a `Task`: the layouts of its results, the supersteps it
costs, and a kernel that computes its results. Its kinds:

- elementwise ops follow their operands' layout, and each tile applies the op to its block; a
  fused chain of them (`lowering.fusion`) runs as one op, one superstep (`fusion`);
- dot_general is planned as PopLibs plans a matmul (`matmul_plan`): operands are exchanged into
  [B, M, K] and [B, K, N] blocks over a grid of tiles, each tile runs the dot of its blocks into
  f32 partials, and a K split is reduced across tiles in a second superstep;
- reduce runs in stages: each tile reduces its block, then partials are exchanged to the tiles
  that own the output and reduced again;
- views (reshapes, broadcasts, sharding annotations, barriers) cost
  nothing and hold no storage of their own;
- convolution is planned the same way, its rows the output positions and its depth the input
  channels times the kernel positions (`conv`);
- collectives and halo exchanges run as whole-tensor kernels whose superstep carries their
  IPU-Link cycles and syncs only their group (`collective`);
- every other op (data movement, gather and scatter, sort, windows, control flow) runs as
  one kernel over the whole tensor, costed as an exchange that brings each result tile its block
  plus the op's work spread evenly over the result's tiles.

Kernels take and return tensors in logical order and compute every tile's share at once. Where
an element sits never changes its value, so an exchange moves nothing in the simulator, and
an elementwise op on all blocks is the op on the whole tensor. What a split can change is kept:
a matmul accumulates in PopLibs' partials type, and a reduction whose depth is split over tiles
adds each tile's run first, then the tiles' partials. Storing
tensors tile by tile instead made the simulator 1.3 to 1.7 times slower than `jax.jit` on a
GPT step (transposes and pads at every change of layout); in logical order it is within a few
percent on one IPU (benchmarks/RESULTS.md).
"""

from __future__ import annotations

from lowering import COLLECTIVES, ELEMENTWISE
from partitioner.tiles.rules.collective import (
    collective_tile_rule,
    halo_tile_rule,
    manual_tile_rule,
    permute_tile_rule,
)
from partitioner.tiles.rules.common import TileRule
from partitioner.tiles.rules.conv import convolution_tile_rule
from partitioner.tiles.rules.elementwise import elementwise_tile_rule
from partitioner.tiles.rules.fusion import fusion_tile_rule
from partitioner.tiles.rules.linalg import LIBRARY_TILE_RULES
from partitioner.tiles.rules.loop import case_tile_rule, while_tile_rule
from partitioner.tiles.rules.matmul import dot_general_tile_rule, operand_layouts
from partitioner.tiles.rules.reduce import reduce_tile_rule
from partitioner.tiles.rules.views import (
    broadcast_tile_rule,
    constant_tile_rule,
    identity_tile_rule,
    reshape_tile_rule,
)
from partitioner.tiles.rules.whole import whole_tensor_tile_rule

# Ops that run as one kernel over the whole tensor (see `whole`): data movement, gather and
# scatter, sort, windows, and the shard ops of per-IPU programs.
_WHOLE = (
    "iota", "transpose", "slice", "dynamic_slice", "dynamic_update_slice",
    "concatenate", "pad", "reverse", "gather", "scatter", "sort", "top_k",
    "reduce_window", "select_and_scatter", "shard_slice", "shard_mask",
    "shard_index", "partition_id",
)  # fmt: skip

# A rule for every op of the vocabulary, with no default: an op added to the vocabulary without
# a decision here fails tests/test_tables.py.
TILE_RULES: dict[str, TileRule] = {
    **LIBRARY_TILE_RULES,  # linear algebra and FFTs in blocks; host callbacks (`linalg`)
    **dict.fromkeys(ELEMENTWISE, elementwise_tile_rule),
    **dict.fromkeys(COLLECTIVES, collective_tile_rule),
    **dict.fromkeys(_WHOLE, whole_tensor_tile_rule),
    "halo_exchange": halo_tile_rule,
    "collective_permute": permute_tile_rule,
    "manual_computation": manual_tile_rule,
    "constant": constant_tile_rule,
    "reshape": reshape_tile_rule,
    "broadcast_in_dim": broadcast_tile_rule,
    "dot_general": dot_general_tile_rule,
    "convolution": convolution_tile_rule,
    "reduce": reduce_tile_rule,
    "fusion": fusion_tile_rule,
    "while": while_tile_rule,
    "case": case_tile_rule,
    "sharding_constraint": identity_tile_rule,
    "optimization_barrier": identity_tile_rule,
}

# Ops that want the program inputs they read first created in layouts of their own.
OPERAND_LAYOUTS = {"dot_general": operand_layouts}

__all__ = ["OPERAND_LAYOUTS", "TILE_RULES", "TileRule"]

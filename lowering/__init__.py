"""lowering: the first stage of ipujax. JAX -> StableHLO -> a small typed IR that evaluates
exactly like `jax.jit`.

    graph = lowering.lower(fun, *args)         # trace and import
    lowering.verify(graph)                      # check the IR's invariants
    lowering.evaluate(graph, *args)             # run it with jax.lax, op by op

Per-op behaviour lives in tables keyed by op name, each covering `VOCABULARY`: `IMPORT_RULES`
(MLIR attributes), `SHAPE_RULES`, `EVAL_RULES` (jax.lax) and `COST_RULES` (FLOPs and bytes).
The names below are the package's public face: later stages import only these.
"""

from lowering.cost_rules import COST_RULES, OpCost, op_cost
from lowering.dead_code import eliminate_dead_code
from lowering.dtypes import is_float
from lowering.errors import (
    SHARD_MAP_DETAIL,
    IpujaxError,
    LoweringError,
    UnsupportedOpError,
    VerifyError,
)
from lowering.eval_rules import EVAL_RULES
from lowering.evaluator import (
    apply_rule,
    evaluate,
    flatten_args,
    interpret,
    restore_keys,
    run_op,
)
from lowering.fusion import FUSION, fuse_elementwise, fusible, members, scalar_operand
from lowering.import_reuse import KeptImports, imports_reused
from lowering.import_rules import IMPORT_RULES
from lowering.importer import lower
from lowering.ir import Graph, Op, Value, free_values, max_value_id, op_reads, producers, walk
from lowering.locations import SourceLoc, raised_at
from lowering.loops import counted_trips, loop_counter, renamed, unroll_limit, unroll_loops
from lowering.mesh_rules import local_mesh_axes
from lowering.paths import shorten_paths
from lowering.regions import binary_op, scatter_combiner
from lowering.shape_rules import SHAPE_RULES, infer_types
from lowering.signature import op_signature
from lowering.unit_reductions import reshape_unit_reductions
from lowering.verifier import verify
from lowering.vocabulary import (
    BINARY,
    COLLECTIVES,
    CONTRACTIONS,
    CONTROL,
    DATA_MOVEMENT,
    ELEMENTWISE,
    FUSIONS,
    SHARD_OPS,
    SOURCES,
    STRUCTURED,
    VOCABULARY,
)

__all__ = [
    "BINARY",
    "COLLECTIVES",
    "CONTRACTIONS",
    "CONTROL",
    "COST_RULES",
    "DATA_MOVEMENT",
    "ELEMENTWISE",
    "EVAL_RULES",
    "FUSION",
    "FUSIONS",
    "IMPORT_RULES",
    "SHAPE_RULES",
    "SHARD_MAP_DETAIL",
    "SHARD_OPS",
    "SOURCES",
    "STRUCTURED",
    "VOCABULARY",
    "Graph",
    "IpujaxError",
    "KeptImports",
    "LoweringError",
    "Op",
    "OpCost",
    "SourceLoc",
    "UnsupportedOpError",
    "Value",
    "VerifyError",
    "apply_rule",
    "binary_op",
    "counted_trips",
    "eliminate_dead_code",
    "evaluate",
    "flatten_args",
    "free_values",
    "fuse_elementwise",
    "fusible",
    "imports_reused",
    "infer_types",
    "interpret",
    "is_float",
    "local_mesh_axes",
    "loop_counter",
    "lower",
    "max_value_id",
    "members",
    "op_cost",
    "op_reads",
    "op_signature",
    "producers",
    "raised_at",
    "renamed",
    "reshape_unit_reductions",
    "restore_keys",
    "run_op",
    "scalar_operand",
    "scatter_combiner",
    "shorten_paths",
    "unroll_limit",
    "unroll_loops",
    "verify",
    "walk",
]

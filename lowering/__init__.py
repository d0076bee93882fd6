"""lowering: the first stage of ipujax. JAX -> StableHLO -> a small typed IR that evaluates
exactly like `jax.jit`.

    graph = lowering.lower(fun, *args)         # trace and import
    lowering.verify(graph)                      # check the IR's invariants
    lowering.evaluate(graph, *args)             # run it with jax.lax, op by op

Per-op behaviour lives in tables keyed by op name, each covering `VOCABULARY`: `IMPORT_RULES`
(MLIR attributes), `SHAPE_RULES`, `EVAL_RULES` (jax.lax) and `COST_RULES` (FLOPs and bytes).
"""

from lowering.cost_rules import COST_RULES, OpCost, op_cost
from lowering.dead_code import eliminate_dead_code
from lowering.errors import (
    IpujaxError,
    LoweringError,
    UnsupportedOpError,
    VerifyError,
)
from lowering.eval_rules import EVAL_RULES
from lowering.evaluator import apply_rule, evaluate, interpret, run_op
from lowering.import_rules import IMPORT_RULES
from lowering.importer import lower
from lowering.ir import Graph, Op, Value, free_values, producers, walk
from lowering.locations import SourceLoc
from lowering.shape_rules import SHAPE_RULES, infer_types
from lowering.verifier import verify
from lowering.vocabulary import VOCABULARY

__all__ = [
    "COST_RULES",
    "EVAL_RULES",
    "IMPORT_RULES",
    "SHAPE_RULES",
    "VOCABULARY",
    "Graph",
    "IpujaxError",
    "LoweringError",
    "Op",
    "OpCost",
    "SourceLoc",
    "UnsupportedOpError",
    "Value",
    "VerifyError",
    "apply_rule",
    "eliminate_dead_code",
    "evaluate",
    "free_values",
    "infer_types",
    "interpret",
    "lower",
    "op_cost",
    "producers",
    "run_op",
    "verify",
    "walk",
]

"""Ops that run library code rather than one StableHLO instruction: LAPACK's factorisations
and solves and the FFT (`linalg`), and Python on the host (`callbacks`).

`op_name` names the vocabulary op an MLIR op imports as, reading a custom call's target (jax
spells LAPACK and host callbacks as `stablehlo.custom_call @target`). The families' per-op
tables are merged here for the shared tables (`import_rules`, `shape_rules`, `eval_rules`,
`cost_rules`, which adds each op's bytes to its FLOPs).
"""

from __future__ import annotations

from typing import Any

from jaxlib.mlir import ir

from lowering.callbacks import (
    CALLBACK_EVAL_RULES,
    CALLBACK_FLOPS,
    CALLBACK_IMPORT_RULES,
    CALLBACK_SHAPE_RULES,
    CALLBACK_TARGETS,
)
from lowering.linalg import (
    LINALG_EVAL_RULES,
    LINALG_FLOPS,
    LINALG_IMPORT_RULES,
    LINALG_SHAPE_RULES,
    lapack_op_name,
)
from lowering.vocabulary import ir_name

_CUSTOM_CALL = "stablehlo.custom_call"


def custom_call_target(op: Any) -> str:
    return ir.StringAttr(op.attributes["call_target_name"]).value


def op_name(op: Any, name: str | None = None) -> str | None:
    """The vocabulary name of an MLIR op (a custom call's by its target), or None; `name`, its
    MLIR name, when the caller has it."""
    name = op.operation.name if name is None else name
    if name != _CUSTOM_CALL:
        return ir_name(name)
    target = custom_call_target(op)
    if target in CALLBACK_TARGETS:
        return "host_callback"
    return lapack_op_name(target)


def custom_call_detail(target: str) -> str:
    """What an unsupported custom call is, for its `UnsupportedOpError`: LAPACK routines
    ipujax does not run are named, with what it does run."""
    if target.startswith("lapack_") and lapack_op_name(target) is None:
        return (
            f"custom_call target {target!r}, a LAPACK routine ipujax does not run (jnp.linalg's "
            "qr, eigh, svd, ...): it runs cholesky, lu, solve and solve_triangular; "
            "call this one outside the function given to ipujax.jit"
        )
    return f"custom_call target {target!r}"


LIBRARY_IMPORT_RULES = {**LINALG_IMPORT_RULES, **CALLBACK_IMPORT_RULES}
LIBRARY_SHAPE_RULES = {**LINALG_SHAPE_RULES, **CALLBACK_SHAPE_RULES}
LIBRARY_EVAL_RULES = {**LINALG_EVAL_RULES, **CALLBACK_EVAL_RULES}
LIBRARY_FLOPS = {**LINALG_FLOPS, **CALLBACK_FLOPS}

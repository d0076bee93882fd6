"""Host callbacks: `jax.debug.print`, `jax.debug.callback`, `jax.pure_callback` and unordered
`io_callback`, which jax lowers on CPU to a custom call (`xla_ffi_python_cpu_callback`) whose
backend config indexes the Python functions the lowering keeps (`host_callbacks`).

The IR's `host_callback` op holds that function itself (`HostFunction`), so its evaluation runs
it again at run time, inside the runtime's one jitted program, with the values the program
computed: through `jax.debug.callback` when it returns nothing (a print), `io_callback` when it
has side effects and results, `pure_callback` otherwise. jax's own function formats and prints,
so the text is `jax.jit`'s. It is the vocabulary's one op with side effects
(`vocabulary.SIDE_EFFECTS`): dead-code elimination keeps it when nothing reads its results.

Ordered callbacks (`ordered=True`) thread a token through the program, a type the IR does not
have; they are refused where the token appears.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.experimental import io_callback
from jaxlib.mlir import ir

from lowering import locations
from lowering.dtypes import numpy_dtype
from lowering.errors import UnsupportedFeatureError, UnsupportedOpError
from lowering.ir import Graph, Value

Array = Any
Aval = jax.ShapeDtypeStruct

# The custom-call targets of jax's Python callbacks, on CPU and GPU.
CALLBACK_TARGETS = frozenset({"xla_ffi_python_cpu_callback", "xla_ffi_python_gpu_callback"})

# The Python functions of the module being imported, in the order its custom calls index them.
_HOST_CALLBACKS: ContextVar[Sequence[Callable[..., Any]] | None] = ContextVar(
    "host_callbacks", default=None
)


@contextlib.contextmanager
def host_callbacks(functions: Sequence[Callable[..., Any]]) -> Iterator[None]:
    """While importing, a callback custom call's `index` names one of these functions."""
    token = _HOST_CALLBACKS.set(tuple(functions))
    try:
        yield
    finally:
        _HOST_CALLBACKS.reset(token)


def lowered_host_callbacks(lowered: Any) -> Sequence[Callable[..., Any]]:
    """The Python functions a `jax.stages.Lowered` keeps for its callback custom calls."""
    lowering = getattr(lowered, "_lowering", None)
    compile_args = getattr(lowering, "compile_args", None) or {}
    return tuple(compile_args.get("host_callbacks", ()))


def refuse_ordered(lowered: Any, module: ir.Module) -> None:
    """An ordered callback threads a token through the program, which the IR cannot hold:
    refused at the first callback's line, with the fix."""
    if not getattr(getattr(lowered, "_lowering", None), "compile_args", {}).get("ordered_effects"):
        return
    calls = (op for op in _operations(module.body) if _is_callback(op))
    loc = next((locations.decode(op.location) for op in calls), locations.UNKNOWN)
    raise UnsupportedOpError("host_callback", loc, ORDERED_DETAIL)


ORDERED_DETAIL = (
    "an ordered callback (ordered=True), whose token the IR does not hold; "
    "call jax.debug.print or io_callback with ordered=False"
)


def _is_callback(op: Any) -> bool:
    if op.operation.name != "stablehlo.custom_call":
        return False
    return ir.StringAttr(op.attributes["call_target_name"]).value in CALLBACK_TARGETS


def _operations(block: ir.Block) -> Iterator[Any]:
    """Every operation in `block` and in the regions of its operations, in order."""
    for op in block.operations:
        yield op
        for region in op.regions:
            for inner in region.blocks:
                yield from _operations(inner)


@dataclass(frozen=True, slots=True)
class HostFunction:
    """The Python function a callback runs on the host, taking and returning flat arrays; it
    compares by identity and prints as its index and name."""

    index: int
    function: Callable[..., Any] = field(repr=False)


def _host_callback_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> dict[str, Any]:
    functions = _HOST_CALLBACKS.get()
    config = ir.DictAttr(op.attributes["mhlo.backend_config"])
    index = int(ir.IntegerAttr(config["index"]).value)
    if functions is None or index >= len(functions):
        raise UnsupportedFeatureError(
            "a host callback whose Python function this import was not given; import the "
            "function through lowering.lower"
        )
    effect = op.attributes.get("has_side_effect")
    function = functions[index]
    results = tuple(ir.RankedTensorType(r.type) for r in op.results)
    return {
        "callback": HostFunction(index, function),
        "has_side_effect": effect is not None and bool(ir.BoolAttr(effect).value),
        "result_types": tuple((tuple(t.shape), _dtype(t)) for t in results),
    }


def _dtype(tensor: ir.RankedTensorType) -> np.dtype:
    dtype = numpy_dtype(tensor.element_type)
    assert dtype is not None  # the importer checked every result type before calling rules
    return dtype


ResultTypes = tuple[tuple[tuple[int, ...], np.dtype], ...]


def _host_callback_shape_rule(
    *operands: Aval, result_types: ResultTypes, **attrs: Any
) -> tuple[Aval, ...]:
    return tuple(Aval(shape, dtype) for shape, dtype in result_types)


def _host_callback_eval_rule(
    *operands: Array, callback: HostFunction, has_side_effect: bool, result_types: ResultTypes
) -> tuple[Array, ...]:
    """The host function run on the operands when the program runs, returning its results."""
    shapes = tuple(Aval(shape, dtype) for shape, dtype in result_types)
    if not shapes:
        jax.debug.callback(callback.function, *operands)
        return ()
    if has_side_effect:
        return tuple(io_callback(callback.function, shapes, *operands, ordered=False))
    return tuple(jax.pure_callback(callback.function, shapes, *operands, vmap_method="sequential"))


def _host_callback_flops_rule(
    operands: tuple[Value, ...], results: tuple[Value, ...], **a: Any
) -> int:
    return 0  # its work is the host's; its cost is the round trip (partitioner.cost.linalg)


Rule = Callable[..., Any]
CALLBACK_IMPORT_RULES: dict[str, Rule] = {"host_callback": _host_callback_import_rule}
CALLBACK_SHAPE_RULES: dict[str, Rule] = {"host_callback": _host_callback_shape_rule}
CALLBACK_EVAL_RULES: dict[str, Rule] = {"host_callback": _host_callback_eval_rule}
CALLBACK_FLOPS: dict[str, Rule] = {"host_callback": _host_callback_flops_rule}

"""The importer: a StableHLO module, walked with jaxlib's MLIR bindings, becomes a `Graph`.

`lower(fun, *args)` traces with `jax.jit(fun, keep_unused=True).lower(...)` so that every
argument leaf stays an input of `main`, then walks `main` op by op. Calls to private functions
(`func.call`, which jax emits for nested jits, sorts, argmax, random bits) are inlined, so the
graph is one flat block plus the regions of structured ops. Every op keeps the user's source line.
"""

from __future__ import annotations

import itertools
from collections import ChainMap
from collections.abc import Callable, MutableMapping
from typing import Any

import jax
from jaxlib.mlir import ir

from lowering import locations
from lowering.callbacks import host_callbacks, lowered_host_callbacks, refuse_ordered
from lowering.dtypes import numpy_dtype
from lowering.errors import LoweringError, UnsupportedFeatureError, UnsupportedOpError
from lowering.import_reuse import imported
from lowering.import_rules import IMPORT_RULES, attributes_kept
from lowering.ir import Graph, Op, Value
from lowering.library_ops import custom_call_detail, op_name
from lowering.locations import SourceLoc
from lowering.manual_import import READS_ITS_REGION

_TERMINATORS = frozenset({"func.return", "stablehlo.return", "sdy.return"})
_MLIR = MutableMapping[Any, Value]  # MLIR value -> IR value; MLIR values hash by identity


class _Importer:
    """Walks one module. Holds the value-id counter and the module's private functions."""

    def __init__(self, module: ir.Module) -> None:
        self._ids = itertools.count()
        # Decoded locations and value types, by their uniqued MLIR attribute and type (which
        # hash by identity in the context): a model's layers repeat both thousands of times.
        self._locations: dict[tuple[Any, SourceLoc], SourceLoc] = {}
        self._files: dict[Any, Any] = {}  # the user's frame under each scope (`decode`)
        self._types: dict[Any, tuple[tuple[int, ...], Any]] = {}
        self._functions = {
            ir.StringAttr(op.attributes["sym_name"]).value: op
            for op in module.body.operations
            if op.operation.name == "func.func"
        }

    def main(self) -> Graph:
        func = self._functions["main"]
        block = func.regions[0].blocks[0]
        inputs = tuple(self._new_value(arg.type, func) for arg in block.arguments)
        env = dict(zip(block.arguments, inputs, strict=True))
        ops, outputs = self._block(block, env, locations.UNKNOWN)
        names = tuple(_arg_name(arg, i) for i, arg in enumerate(block.arguments))
        return Graph(inputs=inputs, outputs=outputs, ops=tuple(ops), input_names=names)

    def _new_value(self, mlir_type: ir.Type, owner: Any) -> Value:
        known = self._types.get(mlir_type)
        if known is None:
            tensor = mlir_type if isinstance(mlir_type, ir.RankedTensorType) else None
            dtype = numpy_dtype(tensor.element_type) if tensor is not None else None
            if tensor is None or dtype is None:
                loc = locations.decode(owner.location)
                raise UnsupportedOpError(_mlir_name(owner), loc, f"values of type {mlir_type}")
            known = self._types[mlir_type] = (tuple(tensor.shape), dtype)
        return Value(next(self._ids), *known)

    def _decode(self, location: ir.Location, outer: SourceLoc) -> SourceLoc:
        key = (location.attr, outer)
        found = self._locations.get(key)
        if found is None:
            found = self._locations[key] = locations.decode(location, outer, self._files)
        return found

    def _block(
        self, block: ir.Block, env: _MLIR, outer: SourceLoc
    ) -> tuple[list[Op], tuple[Value, ...]]:
        """Imports a block's ops. `outer` is the location of the op or call around the block:
        ops that jax made without a user frame (inside its own private functions) get it."""
        ops: list[Op] = []
        for mlir_op in block.operations:
            name = _mlir_name(mlir_op)
            if name in _TERMINATORS:
                return ops, tuple(env[v] for v in mlir_op.operands)
            loc = self._decode(mlir_op.location, outer)
            if name == "func.call":
                ops.extend(self._inline_call(mlir_op, env, loc))
            else:
                ops.append(self._op(mlir_op, env, loc, name))
        raise LoweringError(f"a block of {len(ops)} ops has no terminator")

    def _inline_call(self, call: Any, env: _MLIR, loc: SourceLoc) -> list[Op]:
        callee = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
        block = self._functions[callee].regions[0].blocks[0]
        inner = {arg: env[v] for arg, v in zip(block.arguments, call.operands, strict=True)}
        ops, outputs = self._block(block, inner, loc)
        env.update(zip(call.results, outputs, strict=True))
        return ops

    def _op(self, mlir_op: Any, env: _MLIR, loc: SourceLoc, mlir_name: str) -> Op:
        name = op_name(mlir_op, mlir_name)
        if name is None:
            raise UnsupportedOpError(_mlir_name(mlir_op), loc, _custom_call_target(mlir_op))
        operands = tuple([env[v] for v in mlir_op.operands])
        regions = tuple([self._region(r, env, loc) for r in mlir_op.regions])
        try:
            attrs = IMPORT_RULES[name](mlir_op, regions)
        except UnsupportedFeatureError as error:
            raise UnsupportedOpError(name, loc, str(error)) from None
        # Each walk of an op's results makes their binding objects anew: walked once.
        mlir_results = tuple(mlir_op.results)
        results = tuple([self._new_value(r.type, mlir_op) for r in mlir_results])
        env.update(zip(mlir_results, results, strict=True))
        if name in READS_ITS_REGION:
            regions = ()  # its import rule read the region into an attribute
        return Op(name, operands, results, attrs, regions, loc)

    def _region(self, region: ir.Region, env: _MLIR, loc: SourceLoc) -> Graph:
        block = region.blocks[0]
        inputs = tuple(self._new_value(arg.type, block.owner) for arg in block.arguments)
        # A region may read values of the blocks around it: it sees their env behind its own
        # (a chain, not a copy: a large program has thousands of regions).
        inner = ChainMap(dict(zip(block.arguments, inputs, strict=True)), env)
        ops, outputs = self._block(block, inner, loc)
        return Graph(inputs=inputs, outputs=outputs, ops=tuple(ops), name="region")


def _mlir_name(op: Any) -> str:
    # A registered op's class holds its name (a fifth of the time of asking the bindings).
    name = getattr(type(op), "OPERATION_NAME", None)
    return name if isinstance(name, str) else op.operation.name


def _custom_call_target(op: Any) -> str:
    if _mlir_name(op) != "stablehlo.custom_call":
        return ""
    target = ir.StringAttr(op.attributes["call_target_name"]).value
    return custom_call_detail(target)


def _arg_name(arg: ir.BlockArgument, index: int) -> str:
    """jax names each argument leaf in a name location, e.g. `params['w']`."""
    name = locations.decode(arg.location).scope
    return name or f"arg{index}"


def lower(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Graph:
    """Traces `fun` on `args` (arrays or `jax.ShapeDtypeStruct`s, in pytrees) into a Graph."""
    lowered = jax.jit(fun, keep_unused=True).lower(*args, **kwargs)
    module: Any = lowered.compiler_ir("stablehlo")
    refuse_ordered(lowered, module)
    callbacks = tuple(lowered_host_callbacks(lowered))

    def make() -> Graph:
        with host_callbacks(callbacks), attributes_kept():
            return _Importer(module).main()

    graph = imported(module, callbacks, make)
    return Graph(
        inputs=graph.inputs,
        outputs=graph.outputs,
        ops=graph.ops,
        input_names=graph.input_names,
        in_tree=lowered.in_tree,
        out_tree=lowered.out_tree,
        name=getattr(fun, "__name__", "main"),
        out_keys=_key_dtypes(lowered.out_info),
    )


def _key_dtypes(out_info: Any) -> tuple[Any, ...]:
    """Each output leaf's typed-key dtype (StableHLO carries a key as its uint32 data), or
    None; () when there is no key."""
    dtypes = [leaf.dtype for leaf in jax.tree.leaves(out_info)]
    keys = tuple(d if jax.dtypes.issubdtype(d, jax.dtypes.prng_key) else None for d in dtypes)
    return keys if any(k is not None for k in keys) else ()

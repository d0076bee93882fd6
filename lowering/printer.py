"""Readable text for the IR: one line per op, regions indented, the user's line at the end."""

from __future__ import annotations

from typing import Any

import numpy as np

from lowering.ir import Graph, Op, Value

_INDENT = "  "
_MAX_CONSTANT_ELEMENTS = 8


def _format_attr(value: Any) -> str:
    if isinstance(value, np.ndarray):
        if value.size <= _MAX_CONSTANT_ELEMENTS:
            return np.array2string(value, separator=", ").replace("\n", "")
        return f"<{value.dtype.name}[{'x'.join(map(str, value.shape))}]>"
    if isinstance(value, np.dtype):
        return value.name
    return repr(value)


def _format_values(values: tuple[Value, ...]) -> str:
    return ", ".join(f"{v}: {v.type_str}" for v in values)


def format_op(op: Op, depth: int = 0) -> str:
    pad = _INDENT * depth
    results = ", ".join(str(v) for v in op.results)
    operands = ", ".join(str(v) for v in op.operands)
    attrs = ", ".join(f"{k}={_format_attr(v)}" for k, v in op.attrs.items())
    types = " ".join(v.type_str for v in op.results)
    line = f"{pad}{results} = {op.name}({operands})"
    if attrs:
        line += f" {{{attrs}}}"
    line += f" : {types}"
    if op.loc.file:
        line += f"  # {op.loc}"
    lines = [line]
    for index, region in enumerate(op.regions):
        lines.append(f"{pad}{_INDENT}region {index}:")
        lines.append(format_graph(region, depth + 2))
    return "\n".join(lines)


def format_graph(graph: Graph, depth: int = 0) -> str:
    pad = _INDENT * depth
    lines = [f"{pad}{graph.name}({_format_values(graph.inputs)}):"]
    lines.extend(format_op(op, depth + 1) for op in graph.ops)
    outputs = ", ".join(str(v) for v in graph.outputs)
    lines.append(f"{pad}{_INDENT}return {outputs}")
    return "\n".join(lines)

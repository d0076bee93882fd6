"""Import rules: each op's MLIR attributes decoded into plain Python attributes of the IR.

One rule per op, keyed by vocabulary name. A rule reads the op through the typed attribute classes
of jaxlib's MLIR bindings and returns the keyword attributes that the op's other rules take, named
as `jax.lax` names them where jax.lax has the same concept. Attributes are ints, bools, strings,
tuples, numpy dtypes and (for constants) numpy arrays, so that the IR never holds MLIR objects.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy, stablehlo

from lowering import regions as region_rules
from lowering.dtypes import numpy_dtype
from lowering.errors import SHARD_MAP_DETAIL, UnsupportedFeatureError
from lowering.ir import Graph
from lowering.library_ops import LIBRARY_IMPORT_RULES
from lowering.manual_import import MANUAL_IMPORT_RULES
from lowering.vocabulary import BINARY, COLLECTIVES, FUSIONS, SHARD_OPS, UNARY, UNARY_TYPED

Attrs = dict[str, Any]
ImportRule = Callable[[ir.Operation, tuple[Graph, ...]], Attrs]


# ---- attribute readers ---------------------------------------------------------------------


def _attr(op: ir.Operation, name: str) -> ir.Attribute | None:
    return op.attributes.get(name)


def _ints(op: ir.Operation, name: str, default: tuple[int, ...] = ()) -> tuple[int, ...]:
    attr = _attr(op, name)
    if attr is None:
        return default
    if isinstance(attr, ir.DenseI64ArrayAttr):
        return tuple(int(v) for v in ir.DenseI64ArrayAttr(attr))
    return tuple(int(v) for v in np.asarray(ir.DenseIntElementsAttr(attr)).ravel())


def _int(op: ir.Operation, name: str, default: int = 0) -> int:
    attr = _attr(op, name)
    return default if attr is None else int(ir.IntegerAttr(attr).value)


def _bool(op: ir.Operation, name: str, default: bool = False) -> bool:
    attr = _attr(op, name)
    return default if attr is None else bool(ir.BoolAttr(attr).value)


def _pairs(op: ir.Operation, name: str, rank: int) -> tuple[tuple[int, int], ...]:
    flat = _ints(op, name, (0,) * (2 * rank))
    return tuple(zip(flat[0::2], flat[1::2], strict=True))


def _precision(op: ir.Operation) -> tuple[str, ...]:
    attr = _attr(op, "precision_config")
    if attr is None:
        return ("DEFAULT", "DEFAULT")
    return tuple(stablehlo.PrecisionAttr(a).value for a in ir.ArrayAttr(attr))


def result_type(op: ir.Operation, index: int = 0) -> ir.RankedTensorType:
    return ir.RankedTensorType(op.results[index].type)


def _result_dtype(op: ir.Operation) -> np.dtype:
    dtype = numpy_dtype(result_type(op).element_type)
    assert dtype is not None  # the importer checked every result type before calling rules
    return dtype


def _result_shape(op: ir.Operation) -> Any:
    return tuple(result_type(op).shape)


def _constant_value(op: ir.Operation) -> np.ndarray:
    dtype = _result_dtype(op)
    shape = _result_shape(op)
    if dtype.kind == "c":  # the bindings cannot even hand over a complex constant's attribute
        return _complex_constant(str(op), dtype, shape)
    attr: Any = op.attributes["value"]
    if attr.is_splat:
        return np.full(shape, _scalar(attr.get_splat_value(), dtype), dtype=dtype)
    if dtype.kind == "V":  # bf16: a type the bindings' buffer protocol does not know
        return _reparsed(attr, dtype).astype(dtype).reshape(shape)
    return np.asarray(attr).astype(dtype).reshape(shape)


def _reparsed(attr: Any, dtype: np.dtype) -> np.ndarray:
    """A constant of a type the bindings cannot hand to numpy, read by MLIR's own parser.

    MLIR prints a dense constant either as a hex blob of its raw bytes, which reads back exactly
    as unsigned integers of the same width, or as decimal literals that round-trip their type,
    which read back exactly as f32 (every bf16 value is an f32 value).
    """
    text, type_text = str(attr), str(attr.type)
    literal = text[: -len(type_text)]
    shape = list(attr.type.shape)
    with attr.context, ir.Location.unknown():
        if literal.startswith('dense<"0x'):
            bits = ir.IntegerType.get_unsigned(8 * dtype.itemsize)
            raw = ir.Attribute.parse(literal + str(ir.RankedTensorType.get(shape, bits)))
            return np.asarray(raw).view(dtype)
        f32 = ir.RankedTensorType.get(shape, ir.F32Type.get())
        return np.asarray(ir.Attribute.parse(literal + str(f32)))


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan)")


def _complex_constant(text: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A complex constant read from the op's text: `dense<"0x...">`, the elements' raw bytes
    (real and imaginary parts in turn, as numpy lays them out), or `dense<(re,im)>` and lists
    of such pairs in decimal."""
    literal = text[text.index("dense<") + len("dense<") : text.rindex(">")]
    if literal.startswith('"0x'):
        data = np.frombuffer(bytes.fromhex(literal[3 : literal.index('"', 3)]), dtype)
    else:
        parts = _NUMBER.findall(literal.split(">")[0])
        if not parts or len(parts) % 2 or len(parts) // 2 not in (1, int(np.prod(shape))):
            raise UnsupportedFeatureError(f"a complex constant printed as {literal[:60]!r}")
        numbers = np.array([float(p) for p in parts])
        data = (numbers[0::2] + 1j * numbers[1::2]).astype(dtype)
    return np.full(shape, data[0], dtype) if data.size == 1 else data.reshape(shape)


def _scalar(attr: ir.Attribute, dtype: np.dtype) -> Any:
    if isinstance(attr, ir.FloatAttr):
        return ir.FloatAttr(attr).value
    if isinstance(attr, ir.BoolAttr):
        return ir.BoolAttr(attr).value
    integer = ir.IntegerAttr(attr)
    value = integer.value
    # MLIR reports unsigned values through a signed 64-bit reading; wrap them back.
    return (
        value % (1 << (8 * dtype.itemsize)) if np.issubdtype(dtype, np.unsignedinteger) else value
    )


# ---- attributes kept for one import ------------------------------------------------------

# While `attributes_kept` is open, what a rule read from an MLIR attribute (uniqued in its
# context: equal attributes are one key) is kept and handed to the next op that has it: GPT-3's
# 20,000 constants and 26,000 broadcasts repeat a few hundred attributes. The keys hold the
# attributes, and so their context, only until the block ends.
_KEPT: list[dict[Any, Any]] = []


@contextlib.contextmanager
def attributes_kept() -> Iterator[None]:
    _KEPT.append({})
    try:
        yield
    finally:
        _KEPT.pop()


def _kept(key: Any, read: Callable[[], Any]) -> Any:
    """`read()`, or what it gave for `key` earlier in the open `attributes_kept` block (an
    array kept so is shared, and read-only)."""
    if not _KEPT:
        return read()
    kept = _KEPT[-1]
    found = kept.get(key)
    if found is None:
        found = kept[key] = read()
        if isinstance(found, np.ndarray):
            found.flags.writeable = False
    return found


# ---- rules -------------------------------------------------------------------------------


def _no_attrs_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    return {}


def _convert_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    return {"new_dtype": _result_dtype(op)}


def _reduce_precision_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    return {
        "exponent_bits": _int(op, "exponent_bits"),
        "mantissa_bits": _int(op, "mantissa_bits"),
    }


def _compare_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    direction = stablehlo.ComparisonDirectionAttr(op.attributes["comparison_direction"]).value
    kind = _attr(op, "compare_type")
    compare_type = stablehlo.ComparisonTypeAttr(kind).value if kind is not None else "NOTYPE"
    return {"direction": direction, "compare_type": compare_type}


def _constant_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    try:
        key = ("constant", op.attributes["value"])
    except TypeError:  # a complex constant, whose attribute the bindings cannot hand over
        return {"value": _constant_value(op)}
    return {"value": _kept(key, lambda: _constant_value(op))}


def _iota_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    return {
        "dtype": _result_dtype(op),
        "shape": _result_shape(op),
        "dimension": _int(op, "iota_dimension"),
    }


def _broadcast_in_dim_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    key = ("broadcast", op.results[0].type, _attr(op, "broadcast_dimensions"))
    return _kept(
        key,
        lambda: {
            "shape": _result_shape(op),
            "broadcast_dimensions": _ints(op, "broadcast_dimensions"),
        },
    )


def _reshape_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    return {"new_sizes": _result_shape(op)}


def _transpose_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    return {"permutation": _ints(op, "permutation")}


def _slice_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    starts = _ints(op, "start_indices")
    return {
        "start_indices": starts,
        "limit_indices": _ints(op, "limit_indices"),
        "strides": _ints(op, "strides", (1,) * len(starts)),
    }


def _dynamic_slice_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    return {"slice_sizes": _ints(op, "slice_sizes")}


def _concatenate_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    return {"dimension": _int(op, "dimension")}


def _pad_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    low = _ints(op, "edge_padding_low")
    high = _ints(op, "edge_padding_high")
    interior = _ints(op, "interior_padding", (0,) * len(low))
    return {"padding_config": tuple(zip(low, high, interior, strict=True))}


def _reverse_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    return {"dimensions": _ints(op, "dimensions")}


def _gather_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    dims = stablehlo.GatherDimensionNumbers(op.attributes["dimension_numbers"])
    return {
        "offset_dims": tuple(dims.offset_dims),
        "collapsed_slice_dims": tuple(dims.collapsed_slice_dims),
        "start_index_map": tuple(dims.start_index_map),
        "operand_batching_dims": tuple(dims.operand_batching_dims),
        "start_indices_batching_dims": tuple(dims.start_indices_batching_dims),
        "index_vector_dim": int(dims.index_vector_dim),
        "slice_sizes": _ints(op, "slice_sizes"),
        "indices_are_sorted": _bool(op, "indices_are_sorted"),
    }


def _scatter_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    dims = stablehlo.ScatterDimensionNumbers(op.attributes["scatter_dimension_numbers"])
    return {
        "update_window_dims": tuple(dims.update_window_dims),
        "inserted_window_dims": tuple(dims.inserted_window_dims),
        "scatter_dims_to_operand_dims": tuple(dims.scattered_dims_to_operand_dims),
        "operand_batching_dims": tuple(dims.input_batching_dims),
        "scatter_indices_batching_dims": tuple(dims.scatter_indices_batching_dims),
        "index_vector_dim": int(dims.index_vector_dim),
        "indices_are_sorted": _bool(op, "indices_are_sorted"),
        "unique_indices": _bool(op, "unique_indices"),
        "combiner": region_rules.scatter_combiner(regions[0]),
    }


def _sort_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    return {
        "dimension": _int(op, "dimension", -1),
        "is_stable": _bool(op, "is_stable"),
        "num_keys": region_rules.sort_num_keys(regions[0]),
    }


def _top_k_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    return {"k": _int(op, "k")}


def _reduce_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    return {"dimensions": _ints(op, "dimensions")}


def _reduce_window_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    window = _ints(op, "window_dimensions")
    ones = (1,) * len(window)
    return {
        "window_dimensions": window,
        "window_strides": _ints(op, "window_strides", ones),
        "padding": _pairs(op, "padding", len(window)),
        "base_dilation": _ints(op, "base_dilations", ones),
        "window_dilation": _ints(op, "window_dilations", ones),
    }


def _select_and_scatter_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    window = _ints(op, "window_dimensions")
    return {
        "window_dimensions": window,
        "window_strides": _ints(op, "window_strides", (1,) * len(window)),
        "padding": _pairs(op, "padding", len(window)),
        "select": region_rules.select_and_scatter_direction(*regions),
    }


def _dot_general_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    dims = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    contracting = (tuple(dims.lhs_contracting_dimensions), tuple(dims.rhs_contracting_dimensions))
    batch = (tuple(dims.lhs_batching_dimensions), tuple(dims.rhs_batching_dimensions))
    return {
        "dimension_numbers": (contracting, batch),
        "precision": _precision(op),
        "preferred_element_type": _result_dtype(op),
    }


def _convolution_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    dims = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    spatial = len(dims.input_spatial_dimensions)
    ones = (1,) * spatial
    reversal = _attr(op, "window_reversal")
    if reversal is not None and any(ir.DenseBoolArrayAttr(reversal)):
        raise UnsupportedFeatureError("window_reversal")
    lhs = (dims.input_batch_dimension, dims.input_feature_dimension, *dims.input_spatial_dimensions)
    rhs = (
        dims.kernel_output_feature_dimension,
        dims.kernel_input_feature_dimension,
        *dims.kernel_spatial_dimensions,
    )
    out = (
        dims.output_batch_dimension,
        dims.output_feature_dimension,
        *dims.output_spatial_dimensions,
    )
    return {
        "window_strides": _ints(op, "window_strides", ones),
        "padding": _pairs(op, "padding", spatial),
        "lhs_dilation": _ints(op, "lhs_dilation", ones),
        "rhs_dilation": _ints(op, "rhs_dilation", ones),
        "dimension_numbers": (tuple(lhs), tuple(rhs), tuple(out)),
        "feature_group_count": _int(op, "feature_group_count", 1),
        "batch_group_count": _int(op, "batch_group_count", 1),
        "precision": _precision(op),
        "preferred_element_type": _result_dtype(op),
    }


def _sharding_constraint_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    sharding = sdy.TensorShardingAttr(op.attributes["sharding"])
    dims = tuple(sdy.DimensionShardingAttr(d) for d in sharding.dimension_shardings)
    return {
        "mesh": _mesh_axes(op, sharding.mesh_or_ref),
        "dim_axes": tuple(tuple(sdy.AxisRefAttr(a).name for a in d.axes) for d in dims),
        "dim_closed": tuple(bool(d.is_closed) for d in dims),
        "replicated_axes": tuple(sdy.AxisRefAttr(a).name for a in sharding.replicated_axes),
    }


def _mesh_axes(op: ir.Operation, mesh_or_ref: ir.Attribute) -> tuple[tuple[str, int], ...]:
    """The mesh's (axis name, size) pairs, looking a `@mesh` reference up in the module."""
    if not sdy.MeshAttr.isinstance(mesh_or_ref):
        name = ir.FlatSymbolRefAttr(mesh_or_ref).value
        module: Any = op.parent
        while module.name != "builtin.module":
            module = module.parent
        table = ir.SymbolTable(module)
        mesh_or_ref = table[name].attributes["mesh"]
    mesh = sdy.MeshAttr(mesh_or_ref)
    return tuple((sdy.MeshAxisAttr(a).name, sdy.MeshAxisAttr(a).size) for a in mesh.axes)


def _over_ipus_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    raise UnsupportedFeatureError(SHARD_MAP_DETAIL)


def _made_by_ipujax_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    # No StableHLO op has these names: ipujax makes them itself, after import.
    raise UnsupportedFeatureError(f"{op.name}, an op ipujax makes itself")


IMPORT_RULES: dict[str, ImportRule] = {
    **LIBRARY_IMPORT_RULES,
    **{name: _made_by_ipujax_import_rule for name in FUSIONS},
    **{name: _over_ipus_import_rule for name in COLLECTIVES | SHARD_OPS},
    **{name: _no_attrs_import_rule for name in (UNARY | BINARY | UNARY_TYPED)},
    "reduce_precision": _reduce_precision_import_rule,
    "convert": _convert_import_rule,
    "bitcast_convert": _convert_import_rule,
    "compare": _compare_import_rule,
    "complex": _no_attrs_import_rule,
    "select": _no_attrs_import_rule,
    "clamp": _no_attrs_import_rule,
    "constant": _constant_import_rule,
    "iota": _iota_import_rule,
    "broadcast_in_dim": _broadcast_in_dim_import_rule,
    "reshape": _reshape_import_rule,
    "transpose": _transpose_import_rule,
    "slice": _slice_import_rule,
    "dynamic_slice": _dynamic_slice_import_rule,
    "dynamic_update_slice": _no_attrs_import_rule,
    "concatenate": _concatenate_import_rule,
    "pad": _pad_import_rule,
    "reverse": _reverse_import_rule,
    "gather": _gather_import_rule,
    "scatter": _scatter_import_rule,
    "select_and_scatter": _select_and_scatter_import_rule,
    "sort": _sort_import_rule,
    "top_k": _top_k_import_rule,
    "reduce": _reduce_import_rule,
    "reduce_window": _reduce_window_import_rule,
    "dot_general": _dot_general_import_rule,
    "convolution": _convolution_import_rule,
    "while": _no_attrs_import_rule,
    "case": _no_attrs_import_rule,
    "optimization_barrier": _no_attrs_import_rule,
    "sharding_constraint": _sharding_constraint_import_rule,
    **MANUAL_IMPORT_RULES,
}

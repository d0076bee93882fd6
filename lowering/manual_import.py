"""Import rules of shard_map's ops: `sdy.manual_computation` and the collectives its body writes,
read through jaxlib's MLIR bindings. A collective names its IPUs by replica groups; its rule
finds the mesh of the manual computation around it and names them by mesh axes instead
(`lowering.manual`). A collective outside any manual computation is refused."""

from __future__ import annotations

from typing import Any

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from lowering.errors import SHARD_MAP_DETAIL, UnsupportedFeatureError
from lowering.ir import Graph
from lowering.manual import MeshAxes, group_axes, permute_axis, ways

Attrs = dict[str, Any]

# Ops whose region is their reduction, read into an attribute: the op keeps no region.
READS_ITS_REGION = frozenset({"all_reduce", "reduce_scatter"})

# A reduction region's op, as the partitioner's collectives name their reductions.
_REDUCTIONS = {"add": "sum", "maximum": "max", "minimum": "min", "or": "max", "and": "min"}

_WHY = "written in the program (shard_map)"


def _mesh_of(op: ir.Operation, ref: ir.Attribute) -> MeshAxes:
    """The mesh's (axis name, size) pairs, a `@mesh` reference looked up in the module."""
    if not sdy.MeshAttr.isinstance(ref):
        name = ir.FlatSymbolRefAttr(ref).value
        module: Any = op.parent
        while module.name != "builtin.module":
            module = module.parent
        ref = ir.SymbolTable(module)[name].attributes["mesh"]
    mesh = sdy.MeshAttr(ref)
    if len(mesh.device_ids):
        raise UnsupportedFeatureError("a mesh with its own device order; use jax.make_mesh")
    return tuple((sdy.MeshAxisAttr(a).name, sdy.MeshAxisAttr(a).size) for a in mesh.axes)


def _specs(op: ir.Operation, name: str) -> tuple[tuple[tuple[str, ...], ...], ...]:
    per_value = sdy.TensorShardingPerValueAttr(op.attributes[name])
    return tuple(
        tuple(
            tuple(sdy.AxisRefAttr(a).name for a in sdy.DimensionShardingAttr(d).axes)
            for d in sdy.TensorShardingAttr(s).dimension_shardings
        )
        for s in per_value.shardings
    )


def _first_sharding(op: ir.Operation) -> ir.Attribute:
    for name in ("in_shardings", "out_shardings"):
        shardings = sdy.TensorShardingPerValueAttr(op.attributes[name]).shardings
        if len(shardings):
            return sdy.TensorShardingAttr(shardings[0]).mesh_or_ref
    raise UnsupportedFeatureError("a shard_map with no operands and no results")


def manual_computation_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    mesh = _mesh_of(op, _first_sharding(op))
    axes: Any = sdy.ManualAxesAttr(op.attributes["manual_axes"])
    manual = tuple(a if isinstance(a, str) else ir.StringAttr(a).value for a in axes)
    left = [name for name, size in mesh if name not in manual and size > 1]
    if left:
        raise UnsupportedFeatureError(
            f"a shard_map manual over {list(manual)} but not over {left}; ipujax runs a "
            "shard_map over every axis of its mesh: drop axis_names= or shard_map over them all"
        )
    return {
        "mesh": mesh,
        "in_specs": _specs(op, "in_shardings"),
        "out_specs": _specs(op, "out_shardings"),
        "manual_axes": manual,
    }


def _enclosing_mesh(op: ir.Operation) -> MeshAxes:
    """The mesh of the manual computation around `op`, or, in a function a shard_map's body
    calls, the module's one mesh; refused outside any shard_map."""
    parent: Any = op.parent
    while parent is not None and parent.name not in ("sdy.manual_computation", "func.func"):
        parent = parent.parent
    if parent is not None and parent.name == "sdy.manual_computation":
        return _mesh_of(parent, _first_sharding(parent))
    module: Any = parent.parent if parent is not None else None
    meshes = [o for o in module.regions[0].blocks[0].operations if o.name == "sdy.mesh"]
    sizes = [_mesh_of(m, m.attributes["mesh"]) for m in meshes]
    if all(n == 1 for mesh in sizes for _, n in mesh) and _one_device(module):
        return ()  # a shard_map on one device: jax inlines its body, collectives and all
    if parent is None or _is_main(parent) or len(meshes) != 1:
        raise UnsupportedFeatureError(SHARD_MAP_DETAIL)
    return _mesh_of(op, meshes[0].attributes["mesh"])


def _one_device(module: Any) -> bool:
    try:
        return bool(ir.IntegerAttr(module.attributes["mhlo.num_partitions"]).value == 1)
    except KeyError:
        return True


def _is_main(func: Any) -> bool:
    return bool(ir.StringAttr(func.attributes["sym_name"]).value == "main")


def _groups(op: ir.Operation) -> np.ndarray:
    attr = op.attributes["replica_groups"]
    return np.asarray(ir.DenseIntElementsAttr(attr), dtype=np.int64)


def _over(op: ir.Operation, **attrs: Any) -> Attrs:
    mesh = _enclosing_mesh(op)
    axes = group_axes(_groups(op), mesh) if mesh else ()
    return {"axes": axes, "group_size": ways(axes, dict(mesh)), **attrs, "why": _WHY}


def _reduction(regions: tuple[Graph, ...]) -> str:
    """The reduction a collective's region computes; a sharding annotation jax puts on its
    result (over axes the shard_map leaves automatic) changes nothing."""
    name = None
    if regions:
        region = regions[0]
        ops = tuple(o for o in region.ops if o.name != "sharding_constraint")
        if len(ops) == 1 and set(ops[0].operands) == set(region.inputs):
            name = ops[0].name
    if name not in _REDUCTIONS:
        raise UnsupportedFeatureError(f"a collective reducing with {name or 'a region'}")
    return _REDUCTIONS[name]


def _int(op: ir.Operation, name: str) -> int:
    return int(ir.IntegerAttr(op.attributes[name]).value)


def all_reduce_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    return _over(op, reduction=_reduction(regions))


def all_gather_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    return _over(op, dimension=_int(op, "all_gather_dim"))


def reduce_scatter_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    if _reduction(regions) != "sum":
        raise UnsupportedFeatureError("a reduce-scatter that does not sum")
    return _over(op, dimension=_int(op, "scatter_dimension"))


def all_to_all_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    attrs = _over(
        op,
        split_dimension=_int(op, "split_dimension"),
        concat_dimension=_int(op, "concat_dimension"),
    )
    if _int(op, "split_count") != attrs["group_size"]:
        raise UnsupportedFeatureError("an all-to-all whose split count is not its group's size")
    return attrs


def collective_permute_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    mesh = _enclosing_mesh(op)
    pairs = np.asarray(ir.DenseIntElementsAttr(op.attributes["source_target_pairs"]))
    axes, perm = permute_axis(pairs.reshape(-1, 2).astype(np.int64), mesh) if mesh else ((), ())
    return {"axes": axes, "group_size": ways(axes, dict(mesh)), "pairs": perm, "why": _WHY}


def partition_id_import_rule(op: ir.Operation, regions: tuple[Graph, ...]) -> Attrs:
    mesh = _enclosing_mesh(op)
    return {
        "axes": tuple(name for name, _ in mesh),
        "group_size": ways([name for name, _ in mesh], dict(mesh)),
    }


MANUAL_IMPORT_RULES = {
    "manual_computation": manual_computation_import_rule,
    "all_reduce": all_reduce_import_rule,
    "all_gather": all_gather_import_rule,
    "reduce_scatter": reduce_scatter_import_rule,
    "all_to_all": all_to_all_import_rule,
    "collective_permute": collective_permute_import_rule,
    "partition_id": partition_id_import_rule,
}

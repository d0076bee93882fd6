"""partitioner: from a lowered `Graph` on a mesh of IPUs to a per-tile BSP program, its tile
memory and its cost.

    built = partitioner.build(graph, mesh, in_specs, out_specs, partitioner.Options(...))
    built.program        # tasks of supersteps, each costed
    built.memory         # bytes per tile by liveness
    built.cost           # the step's supersteps, collectives, phases and totals

Its role in the pipeline, after `lowering` and before `ipujax`: propagate shardings over a mesh
of IPUs, insert collectives over IPU axes, map every tensor onto tiles, split the program into
phases, schedule BSP supersteps (exchange -> sync -> compute), and cost them with the Target's
numbers (`cost/`, docs/target.md). It may import `lowering`, never `ipujax`. The names below are
its public face; `ipujax` imports nothing else from it.
"""

from partitioner.cost.links import CollectiveCost, axis_traffic, ring_bytes
from partitioner.errors import ConfigError, OutOfMemoryError, ShardingError
from partitioner.memory.check import TileUsage, fullest_tiles
from partitioner.memory.code import CATEGORIES as MEMORY_CATEGORIES
from partitioner.memory.code import OP_VERTEX_KINDS, POPVISION_NAMES
from partitioner.memory.tiles import TileMemory
from partitioner.mesh import (
    IPUS_PER_MACHINE,
    IPUS_PER_POD64,
    SYSTEMS,
    Mesh,
    System,
    active_mesh,
    default_mesh,
    make_mesh,
)
from partitioner.passes import Built, Options, PeakFloor, build, pipeline_peak_floor
from partitioner.phases.streaming import PhaseCost, io_tile_bytes
from partitioner.pipelines.pipeline import Pipeline, without_axis
from partitioner.pipelines.schedule import PipelineCost, StageCost, bubble_fraction
from partitioner.pipelines.schedule import slots as pipeline_slots
from partitioner.printer import format_program
from partitioner.program import Program, Superstep, Task, per_record
from partitioner.reuse import reusing
from partitioner.sharding.combine import BUFFER_BYTES
from partitioner.sharding.explain import explain
from partitioner.sharding.factor_rules import FACTOR_RULES, reduction_kind
from partitioner.sharding.partition import ForcedWhole, Partitioned
from partitioner.sharding.replicas import varying_over
from partitioner.sharding.specs import Sharding, from_spec, user_shardings
from partitioner.step.host import kept_arguments, sent_arguments
from partitioner.step.summary import StepCost
from partitioner.step.trips import (
    OpenLoop,
    counted_cost,
    limited_loops,
    open_loops,
    unfissioned_loops,
)
from partitioner.target import Target
from partitioner.tiles.rules import TILE_RULES
from partitioner.tiles.rules.whole import whole_kernel
from partitioner.verify import verify_dataflow

__all__ = [
    "BUFFER_BYTES",
    "FACTOR_RULES",
    "IPUS_PER_MACHINE",
    "IPUS_PER_POD64",
    "MEMORY_CATEGORIES",
    "OP_VERTEX_KINDS",
    "POPVISION_NAMES",
    "SYSTEMS",
    "TILE_RULES",
    "Built",
    "CollectiveCost",
    "ConfigError",
    "ForcedWhole",
    "Mesh",
    "OpenLoop",
    "Options",
    "OutOfMemoryError",
    "Partitioned",
    "PeakFloor",
    "PhaseCost",
    "Pipeline",
    "PipelineCost",
    "Program",
    "Sharding",
    "ShardingError",
    "StageCost",
    "StepCost",
    "Superstep",
    "System",
    "Target",
    "Task",
    "TileMemory",
    "TileUsage",
    "active_mesh",
    "axis_traffic",
    "bubble_fraction",
    "build",
    "counted_cost",
    "default_mesh",
    "explain",
    "format_program",
    "from_spec",
    "fullest_tiles",
    "io_tile_bytes",
    "kept_arguments",
    "limited_loops",
    "make_mesh",
    "open_loops",
    "per_record",
    "pipeline_peak_floor",
    "pipeline_slots",
    "reduction_kind",
    "reusing",
    "ring_bytes",
    "sent_arguments",
    "unfissioned_loops",
    "user_shardings",
    "varying_over",
    "verify_dataflow",
    "whole_kernel",
    "without_axis",
]

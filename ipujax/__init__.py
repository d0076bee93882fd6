"""ipujax: run JAX programs on a virtual Graphcore IPU and see what the real machine would do.

    @ipujax.jit
    def step(params, batch): ...

    step(params, batch)                                   # jax.jit's numbers, on virtual tiles
    step.lower(params, batch).compile().cost_report()     # cycles, memory per tile, exchange

Public names only; the work is done in `lowering` (JAX -> IR), `partitioner` (shardings, tiles,
supersteps, memory and the cost model) and the modules of this package (API, runtime, report).
"""

from ipujax.api import Compiled, Jitted, Lowered, jit
from ipujax.cache import enable_from_environment, enable_persistent_cache
from ipujax.errors import (
    BatchArgumentWarning,
    ConfigError,
    HostBoundWarning,
    InsideJaxWarning,
    IpujaxError,
    LoopTripsWarning,
    LoweringError,
    OutOfMemoryError,
    ReplicationWarning,
    ReportError,
    ShardingError,
    UnrollLimitWarning,
    UnsupportedOpError,
    VerifyError,
)
from ipujax.numerics import numerics_key
from ipujax.planning import Plan, Plans, plan
from ipujax.report import (
    CollectiveCost,
    CostReport,
    PhaseCost,
    StageCost,
    SuperstepCost,
    TileUsage,
)
from partitioner import Mesh, Pipeline, Target, make_mesh

__all__ = [
    "BatchArgumentWarning",
    "CollectiveCost",
    "Compiled",
    "ConfigError",
    "CostReport",
    "HostBoundWarning",
    "InsideJaxWarning",
    "IpujaxError",
    "Jitted",
    "LoopTripsWarning",
    "Lowered",
    "LoweringError",
    "Mesh",
    "OutOfMemoryError",
    "PhaseCost",
    "Pipeline",
    "Plan",
    "Plans",
    "ReplicationWarning",
    "ReportError",
    "ShardingError",
    "StageCost",
    "SuperstepCost",
    "Target",
    "TileUsage",
    "UnrollLimitWarning",
    "UnsupportedOpError",
    "VerifyError",
    "enable_persistent_cache",
    "jit",
    "make_mesh",
    "numerics_key",
    "plan",
]

enable_from_environment()

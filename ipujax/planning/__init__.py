"""The plan search: the fastest way to run one training step on a system of IPUs that fits
(`ipujax.plan`, `ipujax plan`; docs/plan.md).

A plan is a mesh over every IPU of the system, with axes named as the model's sharding rule
knows them (`dp` replicas; `tp` for 1D tensor parallelism, `tp1` x `tp2` for 2D; `pp` pipeline
stages), and the options that go with it: phased execution, a pipeline's micro-batches and
recomputation. Each plan is costed by the cost model, cost-only, as `ipujax.jit(...).lower(...)
.compile().cost_report()` costs it, and the plans are ranked: those that fit first, then by
samples per second (a workload may give each mesh its own global batch, as Graphcore's configs
do: samples per replica times replicas).

In processing order:
- `candidates`: the systems by name, the meshes over all their IPUs, each mesh's variants;
- `models`: what is costed, a `Model` making the step for a mesh (from a rule or a workload);
- `bounds`: memory lower bounds and the streaming cost bound, from the inputs' specs;
- `costing`: a candidate costed, layered models shallow and extrapolated;
- `search`: the loop that decides what to cost and what to skip, and `plan`;
- `ranking`: the costed `Plan`, the `Skipped`, the ranked `Plans`.
"""

from ipujax.planning.bounds import InputBytes, memory_bound, streaming_bound_seconds
from ipujax.planning.candidates import LAYOUTS, Candidate, meshes, system_ipus
from ipujax.planning.models import Model, data_parallel, samples_per_step, workload_model
from ipujax.planning.ranking import Plan, Plans, Skipped, rank
from ipujax.planning.search import plan, search

__all__ = [
    "LAYOUTS",
    "Candidate",
    "InputBytes",
    "Model",
    "Plan",
    "Plans",
    "Skipped",
    "data_parallel",
    "memory_bound",
    "meshes",
    "plan",
    "rank",
    "samples_per_step",
    "search",
    "streaming_bound_seconds",
    "system_ipus",
    "workload_model",
]

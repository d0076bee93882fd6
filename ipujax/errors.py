"""The ipujax error hierarchy, rooted at `IpujaxError`; every error ipujax raises on purpose is one
of these. Each stage defines its own (lowering, partitioner); this module gathers them."""

from __future__ import annotations

from lowering import IpujaxError, LoweringError, UnsupportedOpError, VerifyError
from partitioner import ConfigError, OutOfMemoryError, ShardingError


class ReportError(IpujaxError):
    """A cost report that cannot be read: malformed JSON, a wrong schema or version."""


class ReplicationWarning(UserWarning):
    """An op that cannot run split ran whole on every IPU and gathered a tensor that was split:
    correct, but it moves and holds the whole tensor on each IPU (`Compiled.explain()`)."""


class BatchArgumentWarning(UserWarning):
    """A pipelined step whose default `batch_argnums` (the last argument) leaves whole another
    argument that leads with the batch's rows: say which arguments carry the batch."""


class HostBoundWarning(UserWarning):
    """A step that spends most of its cycles on host transfers while sending large arguments
    every call: if they live on the IPUs between calls (weights, a KV cache), mark them
    `resident_argnums` / `resident_argnames` (`ipujax.host_bound`)."""


class LoopTripsWarning(UserWarning):
    """A `while` whose trips only a run knows: its cost assumes one trip until the program has
    run, then charges the trips the last run counted (the report's `caveats` say which)."""


class InsideJaxWarning(UserWarning):
    """An `ipujax.jit` function called inside a jax transformation (`jax.jit`, `jax.grad`,
    `jax.eval_shape`, `jax.vmap`...): there it is traced as the function itself, as a nested
    `jax.jit` is, with jax's values and no IPU program to run or cost."""


class UnrollLimitWarning(UserWarning):
    """A counted loop left one whole task where the program would lay out its trips: past the
    unroll limit in a pipeline (all its trips in one stage), or phased where its carried
    values cross phases (all its trips in one phase); the report's `caveats` say which."""


__all__ = [
    "BatchArgumentWarning",
    "ConfigError",
    "HostBoundWarning",
    "InsideJaxWarning",
    "IpujaxError",
    "LoopTripsWarning",
    "LoweringError",
    "OutOfMemoryError",
    "ReplicationWarning",
    "ReportError",
    "ShardingError",
    "UnrollLimitWarning",
    "UnsupportedOpError",
    "VerifyError",
]

# The classes live in the stage that raises them; users meet them as ipujax's, so tracebacks
# and `repr` print `ipujax.OutOfMemoryError`, not the internal package's path.
for _name in __all__:
    globals()[_name].__module__ = "ipujax"

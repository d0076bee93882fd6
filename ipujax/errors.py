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


__all__ = [
    "ConfigError",
    "IpujaxError",
    "LoweringError",
    "OutOfMemoryError",
    "ReplicationWarning",
    "ReportError",
    "ShardingError",
    "UnsupportedOpError",
    "VerifyError",
]

# The classes live in the stage that raises them; users meet them as ipujax's, so tracebacks
# and `repr` print `ipujax.OutOfMemoryError`, not the internal package's path.
for _name in __all__:
    globals()[_name].__module__ = "ipujax"

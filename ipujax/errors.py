"""The ipujax error hierarchy, rooted at `IpujaxError`; every error ipujax raises on purpose is one
of these. Each stage defines its own (lowering, partitioner); this module gathers them."""

from __future__ import annotations

from lowering.errors import IpujaxError, LoweringError, UnsupportedOpError, VerifyError
from partitioner.errors import ConfigError, OutOfMemoryError, ShardingError


class ReportError(IpujaxError):
    """A cost report that cannot be read: malformed JSON, a wrong schema or version."""


__all__ = [
    "ConfigError",
    "IpujaxError",
    "LoweringError",
    "OutOfMemoryError",
    "ReportError",
    "ShardingError",
    "UnsupportedOpError",
    "VerifyError",
]

"""Errors of the partitioning and scheduling stages (the hierarchy's root is in lowering)."""

from __future__ import annotations

from lowering import IpujaxError


class ShardingError(IpujaxError):
    """A sharding that cannot apply: an unknown mesh axis, a rank mismatch, a duplicate axis."""


class OutOfMemoryError(IpujaxError):
    """A tile needs more memory than it has; raised at compile time, before anything runs."""


class ConfigError(IpujaxError):
    """A bad target, mesh or phases setting."""

"""`ipujax.jit`'s settings, checked once when `jit` is called and kept in one record.

What the partitioner needs (phases, replica axes, the collective buffer, the pipeline,
verification) is a `partitioner.Options`, built here once and handed to `build` as it is; the
rest says how to trace and call: the mesh, the shardings, the static, donated and resident
arguments and the real devices.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax.sharding import AbstractMesh

from partitioner import ConfigError, Mesh, Options, Pipeline

VERIFY_ENV = "IPUJAX_VERIFY"
PHASES_FORMS = "None, 'auto' or a non-empty sequence of jax.named_scope names (strings)"


@dataclass(frozen=True, slots=True)
class JitOptions:
    """One `ipujax.jit`'s settings: how to trace and call, and the partitioner's `Options`."""

    mesh: Mesh | None  # None: the mesh in context when the function is traced
    traced_under: AbstractMesh | None  # a jax mesh's own abstract mesh, when given one
    in_shardings: Any
    out_shardings: Any
    static_argnums: tuple[int, ...]
    static_argnames: tuple[str, ...]
    donate_argnums: tuple[int, ...]
    donate_argnames: tuple[str, ...]
    devices: tuple[jax.Device, ...] | None
    build: Options
    resident_argnums: tuple[int, ...] = ()  # on the IPUs between calls (`ipujax.resident`)
    resident_argnames: tuple[str, ...] = ()
    numerics: str = "exact"  # or "ipu": stochastic rounding of float16 results (`numerics`)
    device_iterations: int = 1  # calls per host transfer (`ipujax.latency`)


def build_options(
    phases: Any,
    replica_axes: str | Sequence[str] | None,
    collective_buffer_bytes: int,
    pipeline: Any,
    verify: bool | None,
    fuse: bool = True,
) -> Options:
    """The partitioner's options from `jit`'s keywords, each checked."""
    if phases is not None and pipeline is not None:
        raise ConfigError(
            f"phases={phases!r} with a pipeline: a pipelined step keeps each stage's weights on "
            "its IPUs, and ipujax does not phase within stages; give phases or pipeline"
        )
    return Options(
        phases=checked_phases(phases),
        replica_axes=None if replica_axes is None else as_tuple(replica_axes),
        collective_buffer_bytes=collective_buffer_bytes,
        pipeline=checked_pipeline(pipeline),
        verify=verify_requested() if verify is None else verify,
        fuse=fuse,
    )


def verify_requested() -> bool:
    """Whether to verify each per-IPU program's IR after partitioning (IPUJAX_VERIFY=1): a
    debug aid, on in ipujax's own tests."""
    return os.environ.get(VERIFY_ENV, "").lower() not in ("", "0", "off", "false")


def checked_phases(phases: Any) -> str | tuple[str, ...] | None:
    """`phases=`: None, "auto", or the names of `jax.named_scope`s (a list becomes a tuple)."""
    if phases is None or (isinstance(phases, str) and phases == "auto"):
        return phases
    names = isinstance(phases, Sequence) and not isinstance(phases, str)
    if names and phases and all(isinstance(name, str) for name in phases):
        return tuple(phases)
    raise ConfigError(f"phases={phases!r} is not understood; use {PHASES_FORMS}")


def checked_pipeline(pipeline: Any) -> Pipeline | None:
    if pipeline is None or isinstance(pipeline, Pipeline):
        return pipeline
    raise ConfigError(
        f"pipeline={pipeline!r}: give an ipujax.Pipeline(axis=..., stages=..., microbatches=...)"
    )


def as_tuple(value: int | str | Sequence[Any] | None) -> tuple:
    if value is None:
        return ()
    if isinstance(value, (int, str)):
        return (value,)
    return tuple(value)

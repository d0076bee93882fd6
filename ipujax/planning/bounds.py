"""The plan search's bounds, from the inputs' specs before anything is traced: whether a plan
can fit at all, and how fast a phased plan can at best run.

A plan without phases keeps every input (weights, optimizer state) on chip: when their bytes per
IPU exceed the IPU's memory, it cannot fit. A phased plan holds each input on chip at least while
its phase runs, and all of them in streaming memory: the largest input's bytes per IPU must fit
the chip, and the sum the streaming memory. A phased plan also streams every input byte of an IPU
in at least once a step, which bounds its samples per second from above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from ipujax.planning.candidates import Candidate
from ipujax.specs import input_specs
from partitioner import Mesh, Target, from_spec


def input_bytes(args: tuple, jit_kwargs: dict[str, Any], mesh: Mesh) -> list[float]:
    """Each input's bytes on one IPU, its block under its spec as the partitioner reads it
    (a pipeline's inputs split over its stages, on average)."""
    specs = input_specs(jit_kwargs.get("in_shardings"), args, {})
    pipeline = jit_kwargs.get("pipeline")
    stages = mesh.shape.get(pipeline.axis, 1) if pipeline else 1
    out: list[float] = []
    for i, (leaf, spec) in enumerate(zip(jax.tree.leaves(args), specs, strict=True)):
        shape = tuple(np.shape(leaf))
        block = from_spec(spec, shape, mesh.shape, f"input {i}").local_shape(shape, mesh.shape)
        dtype = getattr(leaf, "dtype", None) or np.asarray(leaf).dtype  # a Python scalar too
        out.append(math.prod(block) * np.dtype(dtype).itemsize / stages)
    return out


@dataclass(frozen=True)
class InputBytes:
    """A candidate's inputs on one IPU: their total, the largest one, whether the optimizer
    state stays off chip, and the samples of a step."""

    total: float
    largest: float
    offchip: bool = False
    samples: int = 1


def memory_bound(candidate: Candidate, inputs: InputBytes, target: Target) -> str | None:
    """Why the plan cannot fit, from its inputs' bytes per IPU alone; None if it may."""
    if candidate.phases:
        return _phased_memory_bound(inputs, target)
    chip = target.bytes_per_ipu
    if not inputs.offchip and inputs.total > chip:
        return (
            f"its inputs are {inputs.total / 1e6:,.0f} MB per IPU, over the chip's "
            f"{chip / 1e6:,.0f} MB"
        )
    return None


def _phased_memory_bound(inputs: InputBytes, target: Target) -> str | None:
    chip = target.bytes_per_ipu
    if inputs.largest > chip:
        return (
            f"its largest input is {inputs.largest / 1e6:,.0f} MB per IPU, over the chip's "
            f"{chip / 1e6:,.0f} MB"
        )
    if inputs.total > target.streaming_bytes_per_ipu:
        return (
            f"its inputs are {inputs.total / 1e9:,.1f} GB per IPU, over the streaming "
            f"memory's {target.streaming_bytes_per_ipu / 1e9:,.0f} GB"
        )
    return None


def streaming_bound_seconds(inputs: InputBytes, target: Target) -> float:
    """A phased step reads every input byte of an IPU from streaming memory at least once."""
    return inputs.total / target.streaming_bytes_per_second

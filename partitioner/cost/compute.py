"""Compute cycles on one tile: matmuls on the AMP units, everything else on the vector path.

The rates are the Target's (docs/target.md, "Compute"). Every formula charges one tile's share
of the work plus the compute set's fixed overhead, because a compute set lasts as long as its
busiest tile.
"""

from __future__ import annotations

import math

import numpy as np

from partitioner.target import Target


def amp_flops_per_cycle(target: Target, dtype: np.dtype) -> int:
    """Matmul rate. Half precision (f16; bf16, which the IPU lacks, is costed as f16) uses the
    fast AMP path; everything else the f32 path."""
    if np.dtype(dtype).itemsize <= 2:
        return target.amp_flops_per_cycle_half
    return target.amp_flops_per_cycle_float


def vector_elements_per_cycle(target: Target, dtype: np.dtype) -> int:
    """Elementwise rate: lanes of the vector datapath, at least one element per cycle."""
    return max(1, target.vector_bytes_per_cycle // np.dtype(dtype).itemsize)


def matmul_cycles(target: Target, flops: int, dtype: np.dtype) -> int:
    """Cycles for one tile's matmul work, plus the compute set's overhead."""
    rate = amp_flops_per_cycle(target, dtype)
    return math.ceil(flops / rate) + target.compute_set_overhead_cycles


def vector_cycles(target: Target, elements: int, dtype: np.dtype, transcendentals: int = 0) -> int:
    """Cycles for one tile's elementwise work, plus the compute set's overhead."""
    arithmetic = math.ceil(elements / vector_elements_per_cycle(target, dtype))
    special = transcendentals * target.transcendental_cycles
    return arithmetic + special + target.compute_set_overhead_cycles

"""The peak of the AMP units, the rate FLOP utilisation is measured against.

What a tile's work costs is in the modules of one concern each: `amp` (matmuls, as PopLibs'
convolution vertex estimates them), `vector` (elementwise ops, casts, reductions) and `copies`
(on-tile copies, transposes, slices, fills). A compute set lasts as long as its busiest tile.
"""

from __future__ import annotations

import numpy as np

from partitioner.target import Target


def amp_flops_per_cycle(target: Target, dtype: np.dtype) -> int:
    """Matmul peak rate per tile. Half precision (f16; bf16, which the IPU lacks, is costed as
    f16) uses the fast AMP path; everything else the f32 path."""
    if np.dtype(dtype).itemsize <= 2:
        return target.amp_flops_per_cycle_half
    return target.amp_flops_per_cycle_float

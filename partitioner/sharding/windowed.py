"""Convolutions whose input arrived split over a dimension their window slides along.

A convolution's windowed spatial dimensions stay whole across IPUs
(`conv_factors.convolution_factor_rule`: a window reads its neighbours), so an input split over
one is gathered whole on every IPU, which convolves all of it there, as an op run whole does.
They are said as such ops are (`ForcedWhole`): the compile's ReplicationWarning and the report's
caveat name them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lowering import Op, Value
from partitioner.sharding.conv_factors import convolution_factor_rule
from partitioner.sharding.partitioned import ForcedWhole
from partitioner.sharding.specs import Sharding

WHY = "split over a dimension its window slides along, which stays whole"


def windowed_gathers(
    ops: Sequence[Op], local: Mapping[Value, tuple[Value, Sharding]]
) -> list[ForcedWhole]:
    """The convolutions of `ops` whose input (as `local` holds it) is split over a windowed
    dimension, each as an op that gathered a split tensor."""
    found = []
    for op in ops:
        if op.name != "convolution" or op.operands[0] not in local:
            continue
        lhs = op.operands[0]
        have = local[lhs][1]
        dims = convolution_factor_rule(op).operands[0]
        if any(have.dims[d] and factor is None for d, factor in enumerate(dims)):
            tensor = f"{lhs.type_str} {have}"
            found.append(ForcedWhole(op.name, str(op.loc), "convolution", tensor, WHY))
    return found

"""The convolution's factor rule, and how a split of a grouped convolution's groups is run.

A convolution is the matmul PopLibs sees: the batch and the output features split freely, the
input features are a reduction. A grouped convolution's channels are `groups` x channels per
group, group major, so its group factor (size `groups`) maps to whole-group blocks of the
channel dims, and each IPU convolves the groups it holds with its group count rewritten
(`local_group_counts`). A split whose shards do not divide the groups would cut a group in two:
the partitioner leaves that factor whole (`uneven_groups`) and says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from lowering import Op, Value
from partitioner.sharding.factors import Factors
from partitioner.sharding.specs import Axes

_BATCH, _CONTRACTED = 0, 2
FEATURES = 1  # the factor of the output features, a grouped convolution's groups


def convolution_factor_rule(op: Op) -> Factors:
    """Factors 0 (the batch), 1 (the output features; a grouped convolution's groups) and 2
    (the contracted input features, a reduction), then one per spatial dim that splits.
    In a weight gradient jax puts the images' batch in the input-feature role, so a
    data-parallel batch leaves the gradient a partial sum, finished by an AllReduce; a grouped
    convolution's weight gradient (`batch_group_count` > 1, its groups' channels in the lhs
    batch role) alike. A grouped convolution's groups are one factor over the lhs channels
    (the lhs batch in that weight gradient), the rhs output features and the result's
    features; the channels within a group stay together. Spatial dims correspond only where a
    window is one element with no stride, padding or dilation (a 1x1 convolution); other
    windows read neighbours (halos), so they stay whole across IPUs."""
    a = op.attrs
    (lb, lf, *ls), (ro, ri, *rs), (ob, of, *os_) = a["dimension_numbers"]
    lhs, rhs = op.operands
    left: list[int | None] = [None] * len(lhs.shape)
    right: list[int | None] = [None] * len(rhs.shape)
    out: list[int | None] = [None] * len(op.results[0].shape)
    groups = group_count(op)
    features = rhs.shape[ro] if groups == 1 else groups
    sizes = [lhs.shape[lb], features, lhs.shape[lf]]
    reduction: frozenset[int] = frozenset()
    right[ro] = out[of] = FEATURES
    if a["batch_group_count"] == 1:
        left[lb] = out[ob] = _BATCH
    else:
        left[lb] = FEATURES  # the weight gradient's groups of channels
    if a["feature_group_count"] == 1:
        # The contracted features (a weight gradient's images, in every group).
        left[lf] = right[ri] = _CONTRACTED
        reduction = frozenset({_CONTRACTED})
    else:
        left[lf] = FEATURES  # the groups of input channels
    for i, (l_dim, r_dim, o_dim) in enumerate(zip(ls, rs, os_, strict=True)):
        window = (rhs.shape[r_dim], a["window_strides"][i], a["padding"][i], a["lhs_dilation"][i])
        if window == (1, 1, (0, 0), 1):  # one element, no stride, padding or dilation
            left[l_dim] = out[o_dim] = len(sizes)
            sizes.append(lhs.shape[l_dim])
    return Factors(
        (tuple(left), tuple(right)), (tuple(out),), tuple(sizes), reduction, "convolution"
    )


def group_count(op: Op) -> int:
    """A convolution's groups: its feature or batch group count (XLA allows one of them > 1)."""
    return max(op.attrs["feature_group_count"], op.attrs["batch_group_count"])


def uneven_groups(op: Op, axes: tuple[Axes, ...], mesh: Mapping[str, int]) -> str:
    """Why an op that is a grouped convolution cannot run with its groups split over
    `axes[1]` ("" when it can, or is no such op): each IPU must hold whole groups, as many as
    every other."""
    if op.name != "convolution" or group_count(op) == 1 or not axes[FEATURES]:
        return ""
    groups, shards = group_count(op), math.prod(mesh[a] for a in axes[FEATURES])
    if groups % shards == 0:
        return ""
    return (
        f"its {groups} groups do not split evenly over {shards} IPUs (mesh axes "
        f"{','.join(axes[FEATURES])}), so its channels are gathered: split them over a "
        f"number of IPUs that divides {groups}"
    )


def local_group_counts(op: Op, lhs: Value) -> dict[str, int]:
    """The group counts of a convolution whose lhs on this IPU is `lhs`: the groups it holds
    (its share of the channels that carry them, whole groups by `uneven_groups`)."""
    a = op.attrs
    (lb, lf, *_), _, _ = a["dimension_numbers"]
    whole = op.operands[0].shape
    fgc, bgc = a["feature_group_count"], a["batch_group_count"]
    return {
        "feature_group_count": fgc * lhs.shape[lf] // whole[lf] if fgc > 1 else 1,
        "batch_group_count": bgc * lhs.shape[lb] // whole[lb] if bgc > 1 else 1,
    }

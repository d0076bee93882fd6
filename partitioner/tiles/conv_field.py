"""The input a tile of a planned convolution reads: its field with halos.

PopLibs plans a convolution as a matmul (`matmul_plan`): rows M are the output positions
(batch x output field), columns N the output channels, depth K the input channels times the
kernel positions. Unlike a matmul's, a convolution's operand is not a [M, K] matrix: neighbouring
outputs and kernel positions read the same input elements, and PopLibs exchanges each input
element a tile needs once (no im2col). So a tile's input block is the part of the input its
block of outputs and kernel positions touches: per spatial dim, (outputs - 1) x stride +
(kernel positions - 1) x dilation + 1 elements, the halo included (docs/target.md, "Compute").
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ConvField:
    """The geometry of one convolution group: rows are (output batch, *output field), depth
    (input channels, *kernel field), each in row-major order."""

    rows: tuple[int, ...]
    depth: tuple[int, ...]
    input_field: tuple[int, ...]  # the input's spatial sizes, before input dilation
    strides: tuple[int, ...]
    kernel_dilation: tuple[int, ...]
    input_dilation: tuple[int, ...]

    @property
    def kernel_positions(self) -> int:
        return math.prod(self.depth[1:])


def block_extents(sizes: tuple[int, ...], elements: int) -> tuple[float, ...]:
    """The extent in each dim of a block of `elements` consecutive elements of a row-major
    array of `sizes`, on average: whole inner dims first (PopLibs cuts a field's outer dims,
    so a tile's block is a run of rows), the dim the block ends in by the fraction it covers."""
    extents: list[float] = []
    left = float(elements)
    for size in reversed(sizes):
        extent = max(1.0, min(float(size), left))
        extents.append(extent)
        left /= extent
    return tuple(reversed(extents))


def input_elements(field: ConvField, rows: int, depth: int) -> int:
    """Input elements one tile reads for a block of `rows` output positions and `depth` of
    the input channels x kernel positions: its batch and channels times, per spatial dim,
    the span its outputs and kernel positions cover (in input elements: a dilated input's
    inserted zeros are not exchanged)."""
    batch, *outputs = block_extents(field.rows, rows)
    channels, *kernel = block_extents(field.depth, depth)
    span = 1.0
    for out, k, stride, k_dil, in_dil, size in zip(
        outputs,
        kernel,
        field.strides,
        field.kernel_dilation,
        field.input_dilation,
        field.input_field,
        strict=True,
    ):
        reach = (out - 1) * stride + (k - 1) * k_dil + 1
        span *= min(size, reach / in_dil)
    return math.ceil(batch * channels * span - 1e-9)

"""Tile low-rank (TLR) matrix-vector multiplication as adaptive optics' real-time controllers
run it: the control matrix that turns wavefront-sensor measurements into deformable-mirror
commands is cut into square tiles, each tile stored as the product of two thin bases of rank
`k`, and each frame's commands are computed from the bases alone (Ltaief et al., "Meeting the
real-time challenges of ground-based telescopes using low-rank matrix computations", SC21;
ecrc/tlrmvm).

The product runs in the three phases of that work: phase 1, per column of tiles j, the stacked
V bases times that column's slice of the measurements (a batch of `nt` matvecs of
[mt k, nb] x [nb]); phase 2, the results reshuffled from column order to row order; phase 3, per
row of tiles i, the U bases side by side times the reshuffled vector (a batch of `mt` matvecs
of [nb, nt k] x [nt k]). Phases 2 and 3 are one `einsum`: the reshuffle is its operand's
transpose. Every tile keeps the same rank (the bases padded to `k` columns), so the batches are
regular arrays; the bases are laid out as the matvecs consume them (U as [mt, nb, nt, k], its
contracted dims last), so a resident operator is placed once in the matmul's own layout.

The matrix itself is synthetic (the MAVIS matrices are data to download, which the examples
never do): a smooth kernel between actuators and measurement points scattered over the pupil,
both ordered along a Morton curve so that a tile couples two small patches, the structure that
makes real control matrices compress. `compress` takes each tile's best rank-`k` approximation
by a randomized SVD (a range finder with oversampling, then an exact SVD of the small factor).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

MAVIS_ACTUATORS = 4092  # MAVIS's reconstructor: M = 4,092 actuators (SC21's MAVIS dataset)
MAVIS_MEASUREMENTS = 19078  # x N = 19,078 wavefront-sensor measurements
TILE = 128  # the tile size nb
RANK = 16  # the rank k kept in every tile
KERNEL_LENGTH = 0.1  # the kernel's correlation length, in pupil widths
OVERSAMPLING = 8  # extra columns of the randomized range finder


@dataclass(frozen=True)
class Shape:
    """An M x N control matrix in tiles of nb x nb, each of rank k."""

    rows: int  # M: actuators (commands out)
    cols: int  # N: measurements (slopes in)
    tile: int = TILE
    rank: int = RANK

    def __post_init__(self) -> None:
        if min(self.rows, self.cols, self.tile, self.rank) < 1:
            raise ValueError(f"every size must be positive, got {self}")
        if self.rank > self.tile:
            raise ValueError(
                f"rank {self.rank} exceeds the tile size {self.tile}: use rank <= tile"
            )

    @property
    def mt(self) -> int:
        """Tiles down a column (rows padded to a whole tile)."""
        return -(-self.rows // self.tile)

    @property
    def nt(self) -> int:
        """Tiles along a row."""
        return -(-self.cols // self.tile)

    @property
    def u_shape(self) -> tuple[int, int, int, int]:
        return (self.mt, self.tile, self.nt, self.rank)

    @property
    def v_shape(self) -> tuple[int, int, int, int]:
        return (self.nt, self.mt, self.rank, self.tile)

    def operator_bytes(self, itemsize: int) -> int:
        """Bytes of U and V together: what a frame streams from tile memory."""
        return 2 * self.mt * self.nt * self.tile * self.rank * itemsize

    def dense_bytes(self, itemsize: int) -> int:
        return self.rows * self.cols * itemsize

    def flops(self) -> int:
        """Multiply-adds of both phases, two FLOPs each."""
        return 2 * 2 * self.mt * self.nt * self.tile * self.rank


def tlr_mvm(u: jax.Array, v: jax.Array, x: jax.Array) -> jax.Array:
    """y = A x for A in TLR form: `u` [mt, nb, nt, k], `v` [nt, mt, k, nb], `x` [nt nb] (the
    measurements padded with zeros to whole tiles, `padded`); y [mt nb], the commands padded
    likewise (the first M are the actuators')."""
    nt, mt, _, nb = v.shape
    yv = jnp.einsum("jikn,jn->jik", v, x.reshape(nt, nb))  # phase 1: V_j^T x_j, per column j
    y = jnp.einsum("ibjk,jik->ib", u, yv)  # phases 2 and 3: reshuffled, then U_i yu_i per row i
    return y.reshape(mt * nb)


def padded(x: np.ndarray, shape: Shape) -> np.ndarray:
    """The measurements in the buffer a frame reads: zeros past N up to whole tiles, as TLR-MVM
    codes allocate it (so the IPU pads nothing)."""
    buffer = np.zeros(shape.nt * shape.tile, x.dtype)
    buffer[: shape.cols] = x
    return buffer


# ---- the synthetic control matrix --------------------------------------------------------------


def _morton(points: np.ndarray, bits: int = 10) -> np.ndarray:
    """The order of `points` in [0, 1)^2 along a Morton (Z) curve: neighbours stay close."""
    cells = np.minimum((points * (1 << bits)).astype(np.int64), (1 << bits) - 1)
    key = np.zeros(len(points), np.int64)
    for bit in range(bits):
        for axis in range(2):
            key |= ((cells[:, axis] >> bit) & 1) << (2 * bit + axis)
    return np.argsort(key, kind="stable")


def _pupil_points(count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` points scattered over the unit square, in Morton order."""
    points = rng.random((count, 2))
    return points[_morton(points)]


def matrix_tiles(shape: Shape, seed: int = 0) -> np.ndarray:
    """The synthetic control matrix as tiles [mt, nt, nb, nb], float32, zero past M and N: an
    exponential kernel exp(-|a - m| / KERNEL_LENGTH) between actuator and measurement points."""
    rng = np.random.default_rng(seed)
    pad = np.full((1, 2), np.inf)
    actuators = _pupil_points(shape.rows, rng)
    sensors = _pupil_points(shape.cols, rng)
    actuators = np.concatenate([actuators, pad.repeat(shape.mt * shape.tile - shape.rows, 0)])
    sensors = np.concatenate([sensors, pad.repeat(shape.nt * shape.tile - shape.cols, 0)])
    a = actuators.reshape(shape.mt, 1, shape.tile, 1, 2)
    m = sensors.reshape(1, shape.nt, 1, shape.tile, 2)
    tiles = np.empty((shape.mt, shape.nt, shape.tile, shape.tile), np.float32)
    for i in range(shape.mt):  # a row of tiles at a time: the distances' float64 stay small
        with np.errstate(invalid="ignore"):
            distance = np.sqrt(((a[i] - m[0]) ** 2).sum(-1))
        tiles[i] = np.nan_to_num(np.exp(-distance / KERNEL_LENGTH), nan=0.0)
    return tiles


def dense_product(tiles: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The uncompressed matrix's product with padded measurements `x`, from its tiles, in
    float64: what the TLR form approximates (padded like `tlr_mvm`'s)."""
    mt, nt, nb, _ = tiles.shape
    y = np.einsum("ijab,jb->ia", tiles, x.reshape(nt, nb), dtype=np.float64)
    return y.reshape(mt * nb)


def compress(tiles: np.ndarray, rank: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Each tile's rank-`rank` approximation U_ij V_ij^T by a randomized SVD, as the bases
    `tlr_mvm` takes: U [mt, nb, nt, k] (singular values folded in), V [nt, mt, k, nb]."""
    nb = tiles.shape[-1]
    probe = np.random.default_rng(seed).standard_normal((nb, min(nb, rank + OVERSAMPLING)))
    basis, _ = np.linalg.qr(tiles @ probe.astype(np.float32))  # the range of each tile
    small = np.swapaxes(basis, -1, -2) @ tiles
    left, sigma, right = np.linalg.svd(small, full_matrices=False)
    u = (basis @ left[..., :rank]) * sigma[..., None, :rank]  # [mt, nt, nb, k]
    v = right[..., :rank, :]  # [mt, nt, k, nb]
    return (
        np.ascontiguousarray(u.transpose(0, 2, 1, 3), np.float32),
        np.ascontiguousarray(v.transpose(1, 0, 2, 3), np.float32),
    )

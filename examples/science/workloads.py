"""The science examples for the cost-report CLI, shapes only (nothing is allocated or run):

    ipujax cost-report examples/science/workloads.py:tlr_mvm
    ipujax cost-report examples/science/workloads.py:tlr_mvm_fp16 --target mk2
    ipujax cost-report examples/science/workloads.py:batched_gemm
    ipujax cost-report examples/science/workloads.py:heat --mesh x=4

Each factory takes an optional `mesh` (the CLI builds it from `--mesh` and `--target`; without
one, a Bow IPU) and returns `(fun, args, jit_kwargs)`: the program its script runs
(`tlr_mvm.py`, `batched_gemm.py`, `stencil.py`), its arguments at the script's default sizes,
and the keywords `ipujax.jit` takes for it. The TLR-MVM's bases and the batched GEMM's A are
resident (`resident_argnums`), as the scripts keep them; the heat equation's field is its
step's updated argument, so it stays on the IPUs too, its rows over every axis of the mesh.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np

import ipujax

if (EXAMPLES := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, EXAMPLES)  # examples/, for `shared`: see shared/__init__.py
from shared import load

tlr = load.example("science", "tlr")
gemm = load.example("science", "batched_gemm")
stencil = load.example("science", "stencil")

GEMM_BATCH, GEMM_SIZE = 1472, 64  # batched_gemm.py's defaults: 1,472 products of 64^3
GRID, STEPS = 1024, 100  # stencil.py's defaults


def _one_ipu(mesh: Any) -> Any:
    return mesh if mesh is not None else ipujax.make_mesh((1,), ("ipu",))


def _spec(shape: tuple[int, ...], dtype: str) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, np.dtype(dtype))


def tlr_mvm(mesh: Any = None, dtype: str = "float32", shape: Any = None) -> tuple:
    """A frame of MAVIS's real-time controller (4,092 actuators x 19,078 measurements, tiles of
    128, rank 16): the bases resident, the padded measurements in, the commands out."""
    shape = shape or tlr.Shape(tlr.MAVIS_ACTUATORS, tlr.MAVIS_MEASUREMENTS)
    args = (
        _spec(shape.u_shape, dtype),
        _spec(shape.v_shape, dtype),
        _spec((shape.nt * shape.tile,), dtype),
    )
    return tlr.tlr_mvm, args, {"mesh": _one_ipu(mesh), "resident_argnums": (0, 1)}


def tlr_mvm_fp16(mesh: Any = None) -> tuple:
    """The same frame with fp16 bases and measurements."""
    return tlr_mvm(mesh, "float16")


def batched_gemm(mesh: Any = None, dtype: str = "float32") -> tuple:
    """1,472 products of [64, 64] x [64, 64]: A resident, B in, C out."""
    a = _spec((GEMM_BATCH, GEMM_SIZE, GEMM_SIZE), dtype)
    b = _spec((GEMM_BATCH, GEMM_SIZE, GEMM_SIZE), dtype)
    return gemm.batched_gemm, (a, b), {"mesh": _one_ipu(mesh), "resident_argnums": (0,)}


def heat(mesh: Any = None) -> tuple:
    """100 steps of the heat equation on a 1,024^2 f32 grid, its rows over the mesh's IPUs."""
    u = _spec((GRID, GRID), "float32")
    return stencil.solver(STEPS), (u,), stencil.jit_kwargs(_one_ipu(mesh))

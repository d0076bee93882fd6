"""Helpers shared by the test folders: small targets, meshes and abstract arguments."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import numpy as np

import ipujax

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
BOW_BYTES_PER_TILE = 638_976  # docs/target.md: 624 KiB per tile on MK2 and Bow
BOW_TILES = 1472


def target(tiles: int = 16) -> ipujax.Target:
    """A Bow IPU cut down to `tiles` tiles (every other number as the real chip)."""
    return ipujax.Target.bow().with_tiles(tiles)


def mesh(tiles: int = 16) -> ipujax.Mesh:
    return ipujax.make_mesh((1,), ("ipu",), target=target(tiles))


def spec(shape: tuple[int, ...], dtype: Any = np.float32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, np.dtype(dtype))


def compile_for(fun: Any, *args: Any, tiles: int = 16, **kwargs: Any) -> ipujax.Compiled:
    """`fun` lowered for `args` (arrays or ShapeDtypeStructs) and compiled for `tiles` tiles."""
    return ipujax.jit(fun, mesh=mesh(tiles)).lower(*args).compile(**kwargs)


def assert_trees_close(ours: Any, expected: Any, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Same pytree structure; floats within tolerance, everything else exactly equal."""
    assert jax.tree.structure(ours) == jax.tree.structure(expected)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(expected), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape
        assert a.dtype == b.dtype
        if np.issubdtype(b.dtype, np.inexact):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(a, b)


def device_steps(report: ipujax.CostReport) -> list[ipujax.SuperstepCost]:
    """The supersteps that run on the IPUs: all but the transfers from and to the host."""
    return [s for s in report.supersteps if s.kind != "host"]


def device_cycles(report: ipujax.CostReport) -> int:
    return sum(s.cycles for s in device_steps(report))


def load_example(folder: str, name: str) -> ModuleType:
    """examples/<folder>/<name>.py, loaded by file path under the name the example's own
    scripts give it (`<folder>_example_<name>`): several folders have a `workloads.py` or a
    `model.py`, so these must not be imported through `sys.path`."""
    full = f"{folder}_example_{name}"
    if full not in sys.modules:
        spec = importlib.util.spec_from_file_location(full, EXAMPLES / folder / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
    return sys.modules[full]

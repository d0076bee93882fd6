"""Helpers shared by the test folders: small targets, meshes and abstract arguments, and the
examples' modules."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import jax
import numpy as np
import pytest

import ipujax

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))  # for the examples' `shared` package and its loader
# examples/<folder>/<name>.py under the name the example's own scripts give it, one copy for
# them and the tests (several folders have a `model.py` or a `workloads.py`).
from shared.load import example as load_example  # noqa: E402

BOW_BYTES_PER_TILE = 638_976  # docs/target.md: 624 KiB per tile on MK2 and Bow
BOW_TILES = 1472


def target(tiles: int = 16) -> ipujax.Target:
    """A Bow IPU cut down to `tiles` tiles (every other number as the real chip)."""
    return ipujax.Target.bow().with_tiles(tiles)


def mesh(tiles: int = 16) -> ipujax.Mesh:
    return ipujax.make_mesh((1,), ("ipu",), target=target(tiles))


def spec(shape: tuple[int, ...], dtype: Any = np.float32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, np.dtype(dtype))


def compile_for(
    fun: Any, *args: Any, tiles: int = 16, fuse: bool = True, **kwargs: Any
) -> ipujax.Compiled:
    """`fun` lowered for `args` (arrays or ShapeDtypeStructs) and compiled for `tiles` tiles;
    `fuse=False` keeps each elementwise op its own compute set (a test of one op's vertex)."""
    return ipujax.jit(fun, mesh=mesh(tiles), fuse=fuse).lower(*args).compile(**kwargs)


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


def run_python(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`python *argv` in a child process at the repository's root, with it first on the child's
    path, on the CPU and with `env` added to the environment; the output as text."""
    environment = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", **env)
    return subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def example_modules(folder: str, names: Sequence[str], tiny: Sequence[str]) -> SimpleNamespace:
    """The modules `names` of examples/<folder>/ as attributes, and `tiny`, the flags that
    make its train.py quick, as `.tiny`."""
    return SimpleNamespace(**{name: load_example(folder, name) for name in names}, tiny=list(tiny))


# ---- the examples' workloads and train.py ---------------------------------------------------


def keyword_defaults(factory: Callable[..., Any]) -> dict[str, Any]:
    """The default of each parameter of a workload factory, by name."""
    return {name: p.default for name, p in inspect.signature(factory).parameters.items()}


def run_train(example: SimpleNamespace, *flags: str) -> int:
    """`train.py` of an `example_modules` namespace, through `main(argv)` with its tiny flags
    and `flags`: the exit status."""
    status: int = example.train.main([*example.tiny, *flags])
    return status


def printed_losses(text: str) -> list[float]:
    """The losses of the `step N loss L` lines train.py printed."""
    return [float(line.split()[3]) for line in text.splitlines() if line.startswith("step ")]


def usage_error(status: int, capsys: pytest.CaptureFixture[str]) -> str:
    """What train.py said when it refused its flags: exit status 2 and one line on stderr."""
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("train.py: error:") and "\n" not in err, err
    return err


def skew_reference(
    monkeypatch: pytest.MonkeyPatch, train: ModuleType, wrong: Callable[[Any], Any]
) -> None:
    """`train.compile_step` returns a reference step (jax.jit's) whose outputs `wrong` alters,
    so that `--check` must fail."""
    original = train.compile_step

    def skewed(*args: object) -> tuple[Any, Any]:
        compiled, reference = original(*args)
        return compiled, lambda *a: wrong(reference(*a))

    monkeypatch.setattr(train, "compile_step", skewed)


def layered_step() -> Callable[..., Any]:
    """An SGD step of an embedding, dense layers and a head, each under its own named scope
    (`params = {"embed", "layers": [...], "head"}`, `x` the batch): the plan search's tests'
    layered model."""

    def step(params: dict[str, Any], x: Any) -> dict[str, Any]:
        def loss(params: dict[str, Any]) -> Any:
            with jax.named_scope("embed"):
                h = x @ params["embed"]
            for i, w in enumerate(params["layers"]):
                with jax.named_scope(f"layer{i}"):
                    h = h + jax.numpy.tanh(h @ w)
            with jax.named_scope("head"):
                return jax.numpy.mean((h @ params["head"]) ** 2)

        grads = jax.grad(loss)(params)
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)

    return step

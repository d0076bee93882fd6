"""The opt-in persistent compile cache: a second process loads the runtime's executable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import ipujax

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import json, jax, jax.numpy as jnp, numpy as np
hits = []
jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event.endswith("cache_hits") else None
)
import ipujax
mesh = ipujax.make_mesh((1,), ("ipu",), target=ipujax.Target.bow().with_tiles(16))
f = ipujax.jit(lambda x, w: jnp.tanh(x @ w).sum(0), mesh=mesh)
x = np.arange(48, dtype=np.float32).reshape(6, 8) / 10
out = f(x, np.ones((8, 5), np.float32))
print(json.dumps({"hits": len(hits), "out": np.asarray(out).tolist()}))
"""


def _child(cache: Path) -> dict:
    env = {**os.environ, "IPUJAX_CACHE_DIR": str(cache), "JAX_PLATFORMS": "cpu"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_runtime_from_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "xla-cache"
    first = _child(cache)
    assert first["hits"] == 0
    assert any(cache.iterdir())
    second = _child(cache)
    assert second["hits"] >= 1  # the runtime's executable, at least
    assert second["out"] == first["out"]


def test_the_cache_is_off_unless_asked_for() -> None:
    assert jax.config.jax_compilation_cache_dir is None or "IPUJAX_CACHE_DIR" in os.environ


def test_enable_makes_the_directory(tmp_path: Path) -> None:
    before = jax.config.jax_compilation_cache_dir
    try:
        path = ipujax.enable_persistent_cache(tmp_path / "a" / "b")
        assert path.is_dir() and jax.config.jax_compilation_cache_dir == str(path)
        f = ipujax.jit(lambda x: jnp.sin(x) * 2)
        x = np.linspace(0, 1, 40, dtype=np.float32)
        np.testing.assert_array_equal(f(x), jax.jit(lambda x: jnp.sin(x) * 2)(x))
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
        from jax.experimental.compilation_cache import compilation_cache

        compilation_cache.reset_cache()

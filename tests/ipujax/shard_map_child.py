"""The shard_map programs of `test_shard_map.py`, and (run as a script, in a child process with
four host devices: jax.jit needs a device per IPU of the mesh) each one's values through
ipujax and through jax.jit on an ipujax mesh, on a jax mesh with Explicit axes given as `mesh=`
and under `jax.set_mesh`, printed as one JSON line of the largest differences.

    XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu PYTHONPATH=. \\
        python tests/ipujax/shard_map_child.py
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

AUTO, EXPLICIT = jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit


def loss(w: jax.Array, x: jax.Array) -> jax.Array:
    return jnp.sum(jnp.tanh(x @ w))


def data_parallel(mesh: Any = None) -> Callable[..., jax.Array]:
    """The shard_map tutorial's data-parallel step: each IPU's gradient of its rows, summed."""

    def step(w: jax.Array, x: jax.Array) -> jax.Array:
        def local(w: jax.Array, x: jax.Array) -> jax.Array:
            return jax.lax.psum(jax.grad(loss)(w, x), "data")

        grads = jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data")), out_specs=P())(w, x)
        return w - 0.1 * grads

    return step


def weights() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(64, 64)).astype(np.float32)
    return w, rng.normal(size=(32, 64)).astype(np.float32)


def collectives(a: jax.Array) -> tuple[jax.Array, ...]:
    """Every collective a shard_map body writes, over a 2 x 2 mesh of axes x and y."""
    i = jax.lax.axis_index("y").astype(a.dtype)
    gathered = jax.lax.all_gather(a, "x", tiled=True)
    scattered = jax.lax.psum_scatter(gathered, "y", tiled=True)
    permuted = jax.lax.ppermute(scattered, "y", [(0, 1), (1, 0)])
    swapped = jax.lax.all_to_all(permuted, "x", 0, 1, tiled=True)
    return swapped * i, jax.lax.psum(a, ("x", "y")), jax.lax.pmax(a, "x")


def program(a: jax.Array) -> tuple[jax.Array, ...]:
    """`collectives` between ops that keep propagating around it."""
    specs = (P("x", "y"), P(), P(None, "y"))
    outs = jax.shard_map(collectives, in_specs=P("x", "y"), out_specs=specs)(jnp.sin(a))
    return tuple(o * 2 for o in outs)


def grid() -> np.ndarray:
    return np.arange(16 * 16, dtype=np.float32).reshape(16, 16) / 100


def resharded(w: jax.Array, x: jax.Array) -> jax.Array:
    """An Explicit-mesh program: its shardings are in its types, `reshard` moves them."""
    h = jnp.tanh(x @ w)  # rows over data, as x's type says
    h = jax.sharding.reshard(h, jax.P(None, "data"))  # columns over data instead
    return (h * jax.typeof(h).sharding.spec.count("data")).sum(axis=0)


def _diff(got: Any, want: Any) -> float:
    pairs = zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
    return max(float(np.max(np.abs(np.asarray(g) - np.asarray(w)))) for g, w in pairs)


def main() -> dict[str, float]:
    import ipujax
    import lowering

    found: dict[str, float] = {}
    w, x = weights()
    auto = jax.make_mesh((4,), ("data",), axis_types=(AUTO,))
    with jax.set_mesh(auto):
        want = jax.jit(data_parallel())(w, x)
    found["ipujax mesh"] = _diff(
        ipujax.jit(data_parallel(), mesh=ipujax.make_mesh((4,), ("data",)))(w, x), want
    )
    explicit = jax.make_mesh((4,), ("data",), axis_types=(EXPLICIT,))
    ws = jax.device_put(w, NamedSharding(explicit, P()))
    xs = jax.device_put(x, NamedSharding(explicit, P("data")))  # the spec is in x's type
    step = data_parallel(explicit)
    with jax.set_mesh(explicit):
        want = jax.jit(step)(ws, xs)
        found["explicit, set_mesh"] = _diff(ipujax.jit(step)(ws, xs), want)
    found["explicit, mesh="] = _diff(ipujax.jit(step, mesh=explicit)(ws, xs), want)
    with jax.set_mesh(explicit):
        want = jax.jit(resharded)(ws, xs)
        found["explicit reshard"] = _diff(ipujax.jit(resharded)(ws, xs), want)
    with jax.set_mesh(jax.make_mesh((2, 2), ("x", "y"), axis_types=(AUTO, AUTO))):
        want = jax.jit(program)(grid())
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((2, 2), ("x", "y"))):
        graph = lowering.lower(program, grid())
    found["reference interpreter"] = _diff(lowering.evaluate(graph, grid()), want)
    found["2 x 2 collectives"] = _diff(
        ipujax.jit(program, mesh=ipujax.make_mesh((2, 2), ("x", "y")))(grid()), want
    )
    return found


if __name__ == "__main__":
    print(json.dumps({"devices": len(jax.devices()), **main()}))

"""Run by test_devices.py in a child process that sees two CPU devices (XLA_FLAGS is read once,
when jax starts, so the pytest process itself cannot): compiles small data- and tensor-parallel
programs, runs each on both devices and on one, and prints one JSON line of what it found.

Not a test module itself (pytest collects only test_*.py); run it by hand to see the figures:

    XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu PYTHONPATH=. \\
        .venv/bin/python tests/ipujax/two_devices_child.py
"""

from __future__ import annotations

import json
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import ipujax
from lowering.evaluator import flatten_args

TARGET = ipujax.Target.bow().with_tiles(16)


def mlp_loss(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] - y) ** 2)


def sgd_step(params: dict, x: jax.Array, y: jax.Array) -> tuple[dict, jax.Array]:
    loss, grads = jax.value_and_grad(mlp_loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


def example(batch: int = 16, width: int = 16, hidden: int = 32) -> tuple[dict, Any, Any]:
    rng = np.random.default_rng(0)
    params = {
        "w1": rng.normal(size=(width, hidden)).astype(np.float32) / 4,
        "b1": rng.normal(size=(hidden,)).astype(np.float32),
        "w2": rng.normal(size=(hidden, width)).astype(np.float32) / 4,
    }
    x = rng.normal(size=(batch, width)).astype(np.float32)
    y = rng.normal(size=(batch, width)).astype(np.float32)
    return params, x, y


def cnn_loss(params: dict, x: jax.Array) -> jax.Array:
    """3x3, depthwise, 1x1 and strided 1x1 convolutions: under the runtime's vmap their weight
    gradients are convolutions grouped over the IPUs, which XLA partitions over devices."""
    dims = ("NHWC", "HWIO", "NHWC")
    conv = lambda x, w, s=1, g=1: jax.lax.conv_general_dilated(  # noqa: E731
        x, w, (s, s), "SAME", dimension_numbers=dims, feature_group_count=g
    )
    h = jax.nn.relu(conv(x, params["c3"]))
    h = jax.nn.relu(conv(h, params["dw"], g=8))
    h = jax.nn.relu(conv(h, params["c1"]) + conv(x, params["skip"]))
    h = jax.nn.relu(conv(h, params["down"], s=2))
    return jnp.mean(h**2)


def cnn_example(batch: int = 8) -> tuple[dict, Any]:
    rng = np.random.default_rng(1)
    shapes = {"c3": (3, 3, 4, 8), "dw": (3, 3, 1, 8), "c1": (1, 1, 8, 8), "skip": (1, 1, 4, 8)}
    params = {k: rng.normal(size=v).astype(np.float32) / 2 for k, v in shapes.items()}
    params["down"] = rng.normal(size=(1, 1, 8, 16)).astype(np.float32) / 2
    return params, rng.normal(size=(batch, 6, 6, 4)).astype(np.float32)


def xla_figures(compiled: ipujax.Compiled, args: tuple) -> dict[str, Any]:
    """The XLA program the devices run: its partitions and each device's FLOPs."""
    flat = flatten_args(compiled.graph, args, {})
    executable = compiled.run.lower(*flat).compile()
    match = re.search(r"num_partitions=(\d+)", executable.as_text())
    analysis = executable.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    return {"partitions": int(match.group(1)) if match else 1, "flops": analysis["flops"]}


def leaves(tree: Any) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


def max_difference(ours: Any, theirs: Any) -> float:
    return max(
        float(np.max(np.abs(a.astype(np.float64) - b)))
        for a, b in zip(leaves(ours), leaves(theirs), strict=True)
    )


def case(fun: Any, mesh: ipujax.Mesh, specs: Any, args: tuple) -> dict[str, Any]:
    """`fun` on every device and on the first one only, with the figures to compare them."""
    spread = ipujax.jit(fun, mesh=mesh, in_shardings=specs).lower(*args).compile()
    single = ipujax.jit(fun, mesh=mesh, in_shardings=specs, devices=jax.devices()[:1])
    single = single.lower(*args).compile()
    ours, alone, expected = spread(*args), single(*args), jax.jit(fun)(*args)
    homes = {d.id for leaf in jax.tree.leaves(ours) for d in leaf.sharding.device_set}
    return {
        "devices": [d.id for d in spread.devices],
        "single_devices": [d.id for d in single.devices],
        "output_devices": sorted(homes),
        "spread": xla_figures(spread, args),
        "single": xla_figures(single, args),
        "exact_vs_one_device": all(
            np.array_equal(a, b) for a, b in zip(leaves(ours), leaves(alone), strict=True)
        ),
        "max_diff_vs_one_device": max_difference(ours, alone),
        "max_diff_vs_jax_jit": max_difference(ours, expected),
    }


def training_loop(mesh: ipujax.Mesh, specs: Any, args: tuple) -> dict[str, Any]:
    """Two SGD steps, the second fed the first's outputs: they stay where the program wants its
    inputs (no resharding, no second XLA compile), and donated ones are consumed."""
    params, x, y = args
    step = ipujax.jit(sgd_step, mesh=mesh, in_shardings=specs, donate_argnums=0)
    compiled = step.lower(*args).compile()
    first, _ = compiled(params, x, y)
    wanted = compiled.run.shardings[: len(jax.tree.leaves(first))]  # params come first
    in_place = all(
        leaf.sharding == s for leaf, s in zip(jax.tree.leaves(first), wanted, strict=True)
    )
    second, loss = compiled(first, x, y)
    expected = jax.jit(sgd_step)(*jax.jit(sgd_step)(params, x, y)[:1], x, y)
    return {
        "outputs_where_inputs_go": in_place,
        "donated_consumed": all(leaf.is_deleted() for leaf in jax.tree.leaves(first)),
        "xla_compiles": compiled.run.jitted._cache_size(),
        "max_diff_vs_jax_jit": max_difference((second, loss), expected),
    }


def main() -> None:
    args = example()
    param_specs = {"w1": P(None, "tp"), "b1": P("tp"), "w2": P("tp", None)}
    dp_tp = ipujax.make_mesh((2, 2), ("dp", "tp"), target=TARGET)
    dp = ipujax.make_mesh((4,), ("dp",), target=TARGET)
    grads = jax.value_and_grad(mlp_loss)
    report = {
        "visible_devices": len(jax.devices()),
        "dp_tp": case(grads, dp_tp, (param_specs, P("dp"), P("dp")), args),
        "dp": case(grads, dp, (None, P("dp"), P("dp")), args),
        "cnn": case(jax.grad(cnn_loss), dp, (None, P("dp")), cnn_example()),
        "loop": training_loop(dp_tp, (param_specs, P("dp"), P("dp")), args),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()

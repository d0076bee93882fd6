"""Lower a 2-layer MLP's loss and gradients to the ipujax IR and check it against jax.jit.

Run with `make demo`. The lowered `Graph` is interpreted op by op with `jax.lax`; its outputs
must equal what `jax.jit` computes for the same function.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np

import lowering


def loss(w1, b1, w2, b2, x, y):
    hidden = jnp.tanh(x @ w1 + b1)
    prediction = hidden @ w2 + b2
    return jnp.mean((prediction - y) ** 2)


# Loss and the gradient with respect to every weight: a forward and a backward pass.
loss_and_grads = jax.value_and_grad(loss, argnums=(0, 1, 2, 3))


def example_args(batch=8, features=4, hidden=16, outputs=3):
    rng = np.random.default_rng(0)
    shapes = [(features, hidden), (hidden,), (hidden, outputs), (outputs,)]
    shapes += [(batch, features), (batch, outputs)]
    return [rng.standard_normal(shape).astype(np.float32) for shape in shapes]


def main():
    args = example_args()
    graph = lowering.lower(loss_and_grads, *args)
    ours = jax.tree.leaves(lowering.evaluate(graph, *args))
    expected = jax.tree.leaves(jax.jit(loss_and_grads)(*args))
    print(f"str(graph): {len(str(graph).splitlines())} lines; ops by name, nested ones included:")
    for name, count in Counter(op.name for op in lowering.walk(graph)).most_common():
        print(f"  {count:3d}  {name}")
    same = len(ours) == len(expected) and all(
        np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(ours, expected, strict=True)
    )
    if not same:
        raise SystemExit("MISMATCH: lowering.evaluate differs from jax.jit")
    print("matches jax.jit")


if __name__ == "__main__":
    main()

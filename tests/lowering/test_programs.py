"""Whole programs, differential against jax.jit: pytrees, control flow, PRNG, autodiff, models."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax
from oracle import BF16, assert_matches_jit, assert_trees_match, integers, op_names, uniform

import lowering


def mlp_params(sizes=(6, 8, 3), dtype=np.float32, seed=0):
    return [
        {
            "w": uniform((m, n), -1, 1, dtype, seed + i) / np.sqrt(m).astype(dtype),
            "b": uniform((n,), -0.1, 0.1, dtype, seed + 10 + i),
        }
        for i, (m, n) in enumerate(itertools.pairwise(sizes))
    ]


def mlp(params, x):
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def mlp_loss(params, x, labels):
    logits = mlp(params, x)
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(labels, 3), axis=-1))


X = uniform((5, 6), seed=7)
LABELS = np.array([0, 2, 1, 1, 0], np.int32)


def test_pytrees_in_and_out():
    def f(inputs, pair, scale):
        a, (b, c) = pair
        return {
            "sum": inputs["x"] + inputs["y"] * scale,
            "nested": (a @ b, (None, c.astype(jnp.int32))),
            "none": None,
            "list": [inputs["x"].max(), jnp.zeros(2)],
        }

    inputs = {"x": uniform((3, 3)), "y": uniform((3, 3), seed=1)}
    pair = (uniform((3, 2), seed=2), (uniform((2, 4), seed=3), uniform((4,), seed=4)))
    graph = assert_matches_jit(f, inputs, pair, np.float32(0.5))
    assert len(graph.outputs) == 5


def test_kwargs_and_python_scalars():
    def f(x, n, *, bias, gain=2.0, flag=True):
        y = x * gain + bias if flag else x
        return y * n, n + 1

    assert_matches_jit(f, X, 3, bias=np.float32(0.25), gain=1.5)
    assert_matches_jit(f, X, 4.5, bias=uniform((6,), seed=2))


def test_scan_rnn():
    def rnn(params, xs, h0):
        def cell(h, x):
            h = jnp.tanh(x @ params["wx"] + h @ params["wh"] + params["b"])
            return h, h.sum()

        return lax.scan(cell, h0, xs)

    params = {"wx": uniform((3, 4), -0.5, 0.5), "wh": uniform((4, 4), -0.5, 0.5, seed=1)}
    params["b"] = uniform((4,), seed=2)
    graph = assert_matches_jit(
        rnn, params, uniform((6, 2, 3), seed=3), np.zeros((2, 4), np.float32)
    )
    assert "while" in op_names(graph)
    assert_matches_jit(
        jax.grad(lambda p, xs, h: rnn(p, xs, h)[1].sum()), params, X[:, :3], X[0, :4]
    )


def test_fori_cond_switch_program():
    def f(x, k):
        def body(i, acc):
            branch = lax.switch(i % 3, [jnp.sin, jnp.cos, lambda v: v * 0.5], acc)
            return lax.cond(i < k, lambda v: v + branch, lambda v: v - 1.0, acc)

        return lax.fori_loop(0, 7, body, x)

    assert {"while", "case"} <= op_names(assert_matches_jit(f, X, 4))


def test_random():
    def f(seed, logits):
        key = jax.random.key(seed)
        k1, k2, k3, k4, k5, k6 = jax.random.split(key, 6)
        return {
            "split": jax.random.key_data(jax.random.split(k1, 3)),
            "normal": jax.random.normal(k2, (4, 3)),
            "uniform": jax.random.uniform(k3, (5,), minval=-1.0, maxval=2.0),
            "bernoulli": jax.random.bernoulli(k4, 0.3, (8,)),
            "permutation": jax.random.permutation(k5, 10),
            "categorical": jax.random.categorical(k6, logits, shape=(6, 2)),
            "randint": jax.random.randint(k6, (5,), -3, 9),
        }

    assert_matches_jit(f, 42, uniform((2, 5), seed=1))
    raw = jax.random.PRNGKey(3)
    assert_matches_jit(lambda k: jax.random.normal(jax.random.fold_in(k, 7), (3,)), raw)


def test_grad_of_mlp():
    params = mlp_params()
    assert_matches_jit(jax.grad(mlp_loss), params, X, LABELS)
    graph = assert_matches_jit(jax.value_and_grad(mlp_loss, argnums=(0, 1)), params, X, LABELS)
    assert "dot_general" in op_names(graph)


def test_vmap():
    def per_example(params, x, label):
        return mlp_loss(params, x[None], label[None])

    params = mlp_params(seed=3)
    assert_matches_jit(jax.vmap(per_example, in_axes=(None, 0, 0)), params, X, LABELS)
    assert_matches_jit(jax.vmap(jax.grad(per_example), in_axes=(None, 0, 0)), params, X, LABELS)


def test_nn_functions():
    def f(x, labels):
        return (
            jax.nn.softmax(x, axis=-1),
            jax.nn.log_softmax(x, axis=0),
            jax.nn.relu(x),
            jax.nn.gelu(x),
            jax.nn.gelu(x, approximate=False),
            jax.nn.one_hot(labels, 4),
            jax.nn.silu(x),
            jax.nn.logsumexp(x, axis=1),
        )

    assert_matches_jit(f, X, integers((5,), np.int32, -1, 4))


def layer_norm(x, gamma, beta, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * gamma + beta


def test_layer_norm():
    gamma, beta = uniform((6,), 0.5, 1.5, seed=1), uniform((6,), seed=2)
    assert_matches_jit(layer_norm, X, gamma, beta)
    assert_matches_jit(jax.grad(lambda x, g, b: layer_norm(x, g, b).sum() ** 2), X, gamma, beta)


def attention_params(d=8, seed=0):
    names = ("wq", "wk", "wv", "wo")
    return {n: uniform((d, d), -1, 1, seed=seed + i) / np.sqrt(d) for i, n in enumerate(names)}


def attention(params, x, heads=2):
    t, d = x.shape[-2:]
    split = lambda y: y.reshape(*y.shape[:-1], heads, d // heads).swapaxes(-2, -3)  # noqa: E731
    q, k, v = (split(layer_norm(x, 1.0, 0.0) @ params[n]) for n in ("wq", "wk", "wv"))
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(d // heads).astype(np.float32)
    mask = jnp.tril(jnp.ones((t, t), bool))
    weights = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
    out = (weights @ v).swapaxes(-2, -3).reshape(*x.shape)
    return x + out @ params["wo"]


def test_causal_attention_forward_and_grad():
    params, x = attention_params(), uniform((2, 5, 8), seed=9)
    assert_matches_jit(attention, params, x)
    assert_matches_jit(jax.grad(lambda p, x: (attention(p, x) ** 2).mean()), params, x)


def test_adamw_step():
    optimizer = optax.adamw(learning_rate=1e-2, weight_decay=0.1)
    params = mlp_params(seed=5)
    opt_state = optimizer.init(params)

    def step(params, opt_state, x, labels):
        loss, grads = jax.value_and_grad(mlp_loss)(params, x, labels)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params2, state2, _ = jax.jit(step)(params, opt_state, X, LABELS)
    assert_matches_jit(step, params2, state2, X, LABELS)
    decayed = jax.tree.map(lambda p: p * 0.99, params)
    assert_matches_jit(lambda p, q: jax.tree.map(jnp.subtract, p, q), params, decayed)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["f16", "bf16"])
def test_low_precision_mlp(dtype):
    params = mlp_params(dtype=dtype, seed=2)
    x = X.astype(dtype)
    graph = assert_matches_jit(mlp, params, x)
    assert graph.outputs[0].dtype == np.dtype(dtype)
    assert_matches_jit(jax.grad(lambda p, x: mlp(p, x).astype(jnp.float32).sum()), params, x)


def test_checkpoint():
    @jax.checkpoint
    def block(x, w):
        return jnp.sin(x @ w) @ w.T

    def loss(x, w):
        return jnp.sum(block(block(x, w), w) ** 2)

    assert_matches_jit(jax.grad(loss, argnums=(0, 1)), X, uniform((6, 6), seed=4))
    policy = jax.checkpoint_policies.checkpoint_dots
    remat = jax.checkpoint(lambda x, w: jnp.tanh(x @ w).sum(), policy=policy)
    assert_matches_jit(jax.grad(remat, argnums=1), X, uniform((6, 3), seed=4))


def test_shape_dtype_struct_args():
    def f(params, x, labels):
        return jax.value_and_grad(mlp_loss)(params, x, labels), jnp.argmax(mlp(params, x), -1)

    params = mlp_params()
    specs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (params, X, LABELS))
    graph = lowering.lower(f, *specs)
    lowering.verify(graph)
    expected = jax.tree.leaves(jax.eval_shape(f, *specs))
    got = [(v.shape, np.dtype(v.dtype)) for v in graph.outputs]
    assert got == [(tuple(e.shape), np.dtype(e.dtype)) for e in expected]
    # The graph lowered from specs runs on concrete arrays of those specs.
    assert_trees_match(lowering.evaluate(graph, params, X, LABELS), jax.jit(f)(params, X, LABELS))


def test_x64_stays_off():
    assert not jax.config.jax_enable_x64
    graph = assert_matches_jit(lambda x, s, n: (x * s, n * 2), X, 2.0, 3)
    assert [v.dtype for v in graph.outputs] == [np.float32, np.int32]

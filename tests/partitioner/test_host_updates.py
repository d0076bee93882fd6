"""A step's state, returned updated, stays on the IPUs whatever sharding the step leaves it in
(as jax.jit leaves results where the program puts them): the host is charged only for what
really leaves the device."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import ipujax


def _step(w: jax.Array, g: jax.Array) -> tuple[jax.Array, jax.Array]:
    return w - 0.1 * g, (g * g).sum()


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")
def test_an_update_in_another_sharding_is_not_sent_to_the_host() -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(256, 512)).astype(np.float32)
    g = rng.normal(size=(256, 512)).astype(jax.numpy.bfloat16)
    mesh = ipujax.make_mesh((4,), ("tp",))
    # w arrives split by rows and leaves split by columns: each IPU holds a [64, 512] block
    # of it before and a [256, 128] block after, the same global type.
    specs = (P("tp", None), P(None, "tp"))
    jitted = ipujax.jit(_step, mesh=mesh, in_shardings=specs, out_shardings=(P(None, "tp"), P()))
    compiled = jitted.lower(w, g).compile()
    new, loss = compiled(w, g)
    want_new, want_loss = jax.jit(_step)(w, g)
    np.testing.assert_allclose(new, want_new, rtol=1e-6)
    np.testing.assert_allclose(np.float32(loss), np.float32(want_loss), rtol=1e-2)
    # The host sends g (a quarter of it to each IPU: 65,536 B of bfloat16 per IPU, 262,144 B
    # in all) and gets the 2-byte loss from each IPU; w and its update never cross the host
    # link, though their blocks differ in shape.
    assert compiled.cost_report().host_bytes == g.nbytes + 4 * 2

"""examples/gpt/decode.py: a GPT decode step with a KV cache, one token a call. Its values are
jax.jit's (and, decoded token by token, the full forward pass's); the cache stays on the IPUs
between calls and the weights are resident, so a call sends only its tokens and position; the
script prints tokens per second and latency per token on one IPU and over a Bow-2000."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import load_example

import ipujax

decode = load_example("gpt", "decode")
model = decode.model
TINY = decode.SIZES["tiny"]


def test_decoding_token_by_token_is_the_forward_pass() -> None:
    # The cache holds what the forward pass recomputes: position t's logits after decoding
    # tokens 0..t one at a time are the forward pass's logits at t.
    params = model.init(jax.random.PRNGKey(1), TINY)
    tokens = jax.random.randint(jax.random.PRNGKey(2), (2, 6), 0, TINY.vocab, jnp.int32)
    want = model.forward(params, tokens)
    step, cache = jax.jit(decode.decode_step), decode.init_cache(TINY, 2)
    for t in range(tokens.shape[1]):
        logits, cache = step(params, cache, tokens[:, t], jnp.int32(t))
        np.testing.assert_allclose(logits, want[:, t], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ipus", [1, 4])
def test_ipujax_decode_equals_jax_jit(ipus: int) -> None:
    mesh = decode.mesh_for(ipus, ipujax.Target.bow().with_tiles(64))
    assert decode.check(TINY, 2, mesh, steps=3) <= 1e-5


def _host_steps(report: ipujax.CostReport) -> tuple[int, int]:
    first, *_, last = report.supersteps
    assert (first.kind, last.kind) == ("host", "host")
    return first.exchange_bytes, last.exchange_bytes


@pytest.mark.parametrize("batch", [1, 8])
def test_a_call_sends_only_tokens_and_position(batch: int) -> None:
    # The weights are resident and the cache comes back updated, so neither is sent: a call
    # sends its tokens (int32 [batch]) and the position (int32), 4 (batch + 1) B, and returns
    # the logits, f32 [batch, 256], 1,024 B a sequence.
    report = decode.decode_report(TINY, batch, decode.mesh_for(1, ipujax.Target.bow()))
    assert _host_steps(report) == (4 * (batch + 1), 1024 * batch)
    tokens, seconds = decode.rate(report, batch)
    assert tokens == pytest.approx(batch / report.seconds)  # one call = one step
    assert seconds == pytest.approx(report.seconds)


def test_streaming_cache_loads_each_layer_in_its_phase() -> None:
    report = decode.decode_report(TINY, 1, decode.mesh_for(1, ipujax.Target.bow()), "streaming")
    assert len(report.phases) >= TINY.layers  # a phase per layer at least
    assert report.streaming_bytes > 0
    assert _host_steps(report)[0] == 8


def test_script_prints_rates(capsys: pytest.CaptureFixture[str]) -> None:
    assert decode.main(["--size", "tiny", "--batch", "1,2"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in out if line.startswith(("one IPU", "tp=4"))]
    assert len(rows) == 4
    for row in rows:
        assert float(row[-3].replace(",", "")) > 0  # ms per token
    assert decode.main(["--size", "tiny", "--batch", "x"]) == 2

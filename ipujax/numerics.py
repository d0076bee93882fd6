"""Which numbers a compiled program computes: `ipujax.jit(numerics=...)` and the key.

    numerics="exact"   jax.jit's numbers (the default): float16 results round to nearest
    numerics="ipu"     the IPU's own: float16 results of the ops an IPU rounds stochastically
                       (`runtime.stochastic.STOCHASTIC_OPS`) rounded so, from their float32
                       value, with bits from the key set by `numerics_key`

    with ipujax.numerics_key(jax.random.key(0)):
        step(params, opt_state, batch)          # the same key gives the same bits

A call under numerics "ipu" with no key set is a `ConfigError` (no silent default seed: a run
is reproducible only from a key its author chose). Costs never change: stochastic rounding is
free on the hardware, so the report only says which numerics the step ran (`CostReport.numerics`)
and, as a caveat, which float16 ops keep round to nearest inside loop bodies and branches.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from ipujax.runtime.stochastic import rounds_stochastically
from lowering import CONTROL, Op, shorten_paths, walk
from partitioner import Built, ConfigError

if TYPE_CHECKING:  # the report shows `numerics_summary`: imported only to type it here
    from ipujax.report import CostReport

NUMERICS = ("exact", "ipu")
_KEY_USAGE = "with ipujax.numerics_key(jax.random.key(0)): around the call"

# The key's uint32 data for calls under numerics "ipu", as `numerics_key` sets it.
_CURRENT: contextvars.ContextVar[Any] = contextvars.ContextVar("ipujax_numerics_key", default=None)


def checked_numerics(numerics: Any) -> str:
    """`numerics=`, checked: "exact" or "ipu"."""
    if isinstance(numerics, str) and numerics in NUMERICS:
        return numerics
    raise ConfigError(
        f"numerics={numerics!r} is not understood; use 'exact' (jax.jit's numbers) or 'ipu' "
        "(float16 results rounded stochastically, as an IPU with stochastic rounding does)"
    )


@contextlib.contextmanager
def numerics_key(key: Any) -> Iterator[None]:
    """Sets the key whose bits calls under `numerics="ipu"` round with, inside the block: a
    typed key (`jax.random.key(0)`) or a raw uint32 one (`jax.random.PRNGKey(0)`). The same key
    gives the same bits; fold a step number in (`jax.random.fold_in`) for fresh bits per step."""
    token = _CURRENT.set(_key_data(key))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def call_key() -> Any:
    """The key's data a call under numerics "ipu" passes the runtime; a `ConfigError` when no
    `numerics_key` block is open."""
    data = _CURRENT.get()
    if data is None:
        raise ConfigError(
            "this program was compiled with numerics='ipu', which rounds float16 results with "
            f"random bits from a key you set: {_KEY_USAGE} (or numerics='exact')"
        )
    return data


def _key_data(key: Any) -> Any:
    """A key as threefry's uint32[2] data (the runtime's kernels fold and draw with threefry);
    a key of another implementation gives two words of its own bits, deterministically."""
    dtype = getattr(key, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise ConfigError(f"numerics_key takes one key, got keys of shape {key.shape}")
        if str(jax.random.key_impl(key)) == "threefry2x32":
            return jax.random.key_data(key)
        return jax.random.bits(key, (2,), jnp.uint32)
    raw = np.asarray(key)
    if raw.dtype != np.uint32 or raw.shape != (2,):
        raise ConfigError(
            f"numerics_key takes a jax key, got {type(key).__name__} of dtype {raw.dtype} and "
            f"shape {raw.shape}; use jax.random.key(seed)"
        )
    return jnp.asarray(raw)


def numerics_caveats(built: Built, numerics: str) -> tuple[str, ...]:
    """Under numerics "ipu", a caveat naming the float16 ops that keep round to nearest because
    they run inside a loop body or a branch (the runtime rounds top-level ops and fusions)."""
    if numerics == "exact":
        return ()
    ops = (task.op for task in built.runnable.tasks)
    inside = [m for op in ops for m in _in_regions(op) if rounds_stochastically(m)]
    if not inside:
        return ()
    where = inside[0].loc
    return (
        shorten_paths(
            f"numerics ipu: {len(inside)} float16 op(s) inside loop bodies or branches round to "
            f"nearest, not stochastically (the first, {inside[0].name}, at {where.file}:"
            f"{where.line}); unroll the loop (a Python for) to round them too"
        ),
    )


def _in_regions(op: Op) -> list[Op]:
    """The ops nested in a loop's or a branch's regions (a fusion's members round)."""
    if op.name not in CONTROL:
        return []
    return [inner for region in op.regions for inner in walk(region)]


def with_numerics(report: CostReport, numerics: str) -> CostReport:
    """`report` saying which numerics the step ran (its figures are the same either way)."""
    if report.numerics == numerics:
        return report
    return dataclasses.replace(report, numerics=numerics)


def numerics_summary(numerics: str) -> str:
    """The report's line for the numerics a step ran."""
    said = {
        "exact": "jax.jit's numbers (float16 rounds to nearest)",
        "ipu": "the IPU's: float16 results of arithmetic, matmuls and casts down rounded "
        "stochastically (costs unchanged)",
    }
    return f"{numerics}, {said[numerics]}" if numerics in said else numerics

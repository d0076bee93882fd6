"""Errors of the lowering stage, and the root of the ipujax error hierarchy.

The hierarchy lives here, at the bottom of the dependency order, so that every package can raise
and catch one family of errors (`ipujax.errors` re-exports it and adds the later stages' errors).
"""

from __future__ import annotations

from lowering.locations import SourceLoc


class IpujaxError(Exception):
    """Root of every error ipujax raises on purpose."""


# Why a collective outside any shard_map region is refused (jax writes them only inside one).
SHARD_MAP_DETAIL = "a collective outside a shard_map; write it in the body of a jax.shard_map"


class UnsupportedOpError(IpujaxError):
    """An operation outside ipujax's op vocabulary, with the user's line that produced it."""

    def __init__(self, op_name: str, loc: SourceLoc, detail: str = "") -> None:
        self.op_name = op_name
        self.loc = loc
        where = f" at {loc}" if loc.file else ""
        what = f"`{op_name}`" + (f" ({detail})" if detail else "")
        super().__init__(
            f"{what}{where} is not supported by ipujax. ipujax runs the ops jax emits for "
            "ordinary programs (lowering.VOCABULARY lists them); compute this part outside the "
            "function you give ipujax, or express it with jax.numpy and jax.lax operations."
        )


class VerifyError(IpujaxError):
    """A Graph breaks an invariant of the IR: a compiler bug, not a user error."""


class LoweringError(IpujaxError):
    """The function or its arguments could not be traced and imported."""


class UnsupportedFeatureError(IpujaxError):
    """Raised by an op's rules for a form of a known op that ipujax does not run; the importer
    turns it into an `UnsupportedOpError` that names the user's line."""

"""ipujax: the public API of the virtual IPU compiler and simulator.

Today this re-exports the lowering stage (JAX -> StableHLO -> `Graph`, and the `jax.lax`
interpreter over it). The virtual IPU runtime and the cost model are built in later issues.
"""

from lowering import Graph, UnsupportedOpError, evaluate, lower

__all__ = ["Graph", "UnsupportedOpError", "evaluate", "lower"]

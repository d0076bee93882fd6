"""Shared test setup: CPU-only JAX and hypothesis profiles.

The default profile "fast" is small and derandomized so CI runs are deterministic; set
IPUJAX_HYPOTHESIS_PROFILE=long for a deeper local search.
"""

import os

# Before anything imports jax: the oracle and the simulator both run on the host CPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import settings

settings.register_profile("fast", max_examples=25, deadline=None, derandomize=True)
settings.register_profile("long", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("IPUJAX_HYPOTHESIS_PROFILE", "fast"))

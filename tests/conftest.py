"""Shared test setup: CPU-only JAX, the IR verifier after partitioning, the shared helpers, and
hypothesis profiles.

The default profile "fast" is small and derandomized so CI runs are deterministic; set
IPUJAX_HYPOTHESIS_PROFILE=long for a deeper local search.
"""

import os
import sys

# Before anything imports jax: the oracle and the simulator both run on the host CPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Every per-IPU program the partitioner makes is checked by the IR verifier (see ipujax.options).
os.environ.setdefault("IPUJAX_VERIFY", "1")
# tests/helpers.py (small targets, meshes, abstract arguments) is shared by every folder.
sys.path.insert(0, os.path.dirname(__file__))

from hypothesis import settings

settings.register_profile("fast", max_examples=25, deadline=None, derandomize=True)
settings.register_profile("long", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("IPUJAX_HYPOTHESIS_PROFILE", "fast"))

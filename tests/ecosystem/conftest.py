"""Shared setup for tests/ecosystem: the meshes each model runs on and the check against jax.jit.

Every test here builds a small model with an ecosystem library (flax, equinox, haiku, optax),
writes its training step as a pure function of array pytrees, and runs it through `ipujax.jit`
on one IPU, on four IPUs data parallel (`dp=4`) and on a 2 x 2 mesh (`dp=2`, `tp=2`, one weight
matrix split over `tp`). The `layout` fixture stands for one of the three.
"""

import os
import sys

import pytest

# layouts.py (the meshes and the check against jax.jit) is shared by the test modules here.
sys.path.insert(0, os.path.dirname(__file__))

from layouts import LAYOUTS, Layout


@pytest.fixture(params=list(LAYOUTS), ids=list(LAYOUTS))
def layout(request: pytest.FixtureRequest) -> Layout:
    return LAYOUTS[request.param]

"""The ResNet example's modules (examples/resnet/), loaded by file path under the names the
example's own scripts use for each other (`resnet_example_<name>`): tests/cli has a
`workloads.py` and examples/gpt a `model.py` of their own, so these must not be imported through
`sys.path`.

Tests that run the ResNet on several IPUs are marked `multi_ipu` (convolutions, max pooling and
its gradient partitioned over dp); `-m "not multi_ipu"` runs the one-IPU ones alone.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers import example_modules

# Small settings for train.py: a few seconds per run, most of it JAX compiling the simulator.
TINY = ["--tiles", "64", "--no-progress"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "multi_ipu: the ResNet on several IPUs (convolution and pooling partitioned over dp); "
        "deselect with -m 'not multi_ipu'",
    )


@pytest.fixture(scope="session")
def resnet() -> SimpleNamespace:
    return example_modules("resnet", ("model", "sharding", "train", "workloads"), TINY)

"""The ResNet example's modules (examples/resnet/), loaded by file path under the names the
example's own scripts use for each other (`resnet_example_<name>`): tests/cli has a
`workloads.py` and examples/gpt a `model.py` of their own, so these must not be imported through
`sys.path`.

Tests that run the ResNet on several IPUs are marked `multi_ipu`: they need convolutions, max
pooling and its gradient partitioned over dp. Deselect them with `-m "not multi_ipu"` while that
partitioning is being worked on.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "resnet"

# Small settings for train.py: a few seconds per run, most of it JAX compiling the simulator.
TINY = ["--tiles", "64", "--no-progress"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "multi_ipu: the ResNet on several IPUs (convolution and pooling partitioned over dp); "
        "deselect with -m 'not multi_ipu'",
    )


def load(name: str) -> ModuleType:
    full = f"resnet_example_{name}"
    if full not in sys.modules:
        spec = importlib.util.spec_from_file_location(full, EXAMPLE / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
    return sys.modules[full]


@pytest.fixture(scope="session")
def resnet() -> SimpleNamespace:
    names = ("model", "sharding", "train", "workloads")
    return SimpleNamespace(**{name: load(name) for name in names}, tiny=list(TINY))

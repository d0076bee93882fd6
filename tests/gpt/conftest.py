"""The GPT example's modules (examples/gpt/), loaded by file path under the names the example's
own scripts use for each other (`gpt_example_<name>`): tests/cli has a `workloads.py` of its
own, so these must not be imported through `sys.path`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt"

# Tiny settings for train.py: a few seconds per run, most of it JAX compiling the simulator.
TINY = ["--layers", "1", "--d-model", "32", "--heads", "4", "--seq", "16", "--batch", "4"]
TINY += ["--tiles", "64", "--no-progress"]


def load(name: str) -> ModuleType:
    full = f"gpt_example_{name}"
    if full not in sys.modules:
        spec = importlib.util.spec_from_file_location(full, EXAMPLE / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
    return sys.modules[full]


@pytest.fixture(scope="session")
def gpt() -> SimpleNamespace:
    names = ("model", "sharding", "train", "generate", "workloads")
    return SimpleNamespace(**{name: load(name) for name in names}, tiny=list(TINY))

"""The GPT example's modules (examples/gpt/), loaded by file path under the names the example's
own scripts use for each other (`gpt_example_<name>`): tests/cli has a `workloads.py` of its
own, so these must not be imported through `sys.path`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers import example_modules

# Tiny settings for train.py: a few seconds per run, most of it JAX compiling the simulator.
TINY = ["--layers", "1", "--d-model", "32", "--heads", "4", "--seq", "16", "--batch", "4"]
TINY += ["--tiles", "64", "--no-progress"]


@pytest.fixture(scope="session")
def gpt() -> SimpleNamespace:
    return example_modules("gpt", ("model", "sharding", "train", "generate", "workloads"), TINY)

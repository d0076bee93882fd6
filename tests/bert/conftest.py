"""The BERT example's modules (examples/bert/), loaded by file path under the names the
example's own scripts use for each other (`bert_example_<name>`): tests/cli has a `workloads.py`
and examples/gpt a `model.py` of their own, so these must not be imported through `sys.path`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers import example_modules

# Small settings for train.py: a few seconds per run, most of it JAX compiling the simulator.
TINY = ["--tiles", "64", "--batch", "8"]


@pytest.fixture(scope="session")
def bert() -> SimpleNamespace:
    return example_modules("bert", ("model", "sharding", "train", "workloads"), TINY)

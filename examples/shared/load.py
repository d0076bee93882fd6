"""Loading an example's modules by file path, each once per process under a name of its own.

Several folders have a `model.py` or a `workloads.py` (and tests/cli a `workloads.py` too), so
the examples must not import each other through `sys.path`: `example("gpt", "model")` is
examples/gpt/model.py as the module `gpt_example_model`, whoever asks for it first, so the
scripts, the tests and the benchmarks share one copy of it (and of its classes).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[1]


def example(folder: str, name: str) -> ModuleType:
    """examples/<folder>/<name>.py, loaded by path as `<folder>_example_<name>`."""
    full = f"{folder}_example_{name}"
    if full not in sys.modules:
        spec = importlib.util.spec_from_file_location(full, EXAMPLES / folder / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
    return sys.modules[full]

"""Compile caches: in memory always, on disk by choice.

In memory, a `Jitted` keeps one `Compiled` per static arguments, tree structure, shapes and
dtypes, so calling it again with the same kinds of arguments neither re-traces nor re-schedules
nor re-compiles. On disk, `enable_persistent_cache(directory)` opts in to jax's persistent
compilation cache: the XLA executable of ipujax's runtime (the slow part of a first call, several
seconds for a GPT step) is stored there and loaded by later processes that compile the same
program. The cache is jax's own, so it holds the process's `jax.jit` executables too. Setting
the environment variable `IPUJAX_CACHE_DIR` before importing ipujax does the same.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
from jax.experimental.compilation_cache import compilation_cache

ENV_VAR = "IPUJAX_CACHE_DIR"


def enable_persistent_cache(directory: str | os.PathLike[str]) -> Path:
    """Keeps compiled XLA executables in `directory` (made if missing) across processes."""
    path = Path(directory).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    # jax skips programs that compile in under a second by default; a simulator's programs
    # are worth keeping whatever their size.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    # jax decides once per process whether the cache is on; a reset makes it look again, so
    # this works after earlier compiles too.
    compilation_cache.reset_cache()
    return path


def enable_from_environment() -> Path | None:
    """Enables the persistent cache when `IPUJAX_CACHE_DIR` is set."""
    directory = os.environ.get(ENV_VAR)
    return enable_persistent_cache(directory) if directory else None

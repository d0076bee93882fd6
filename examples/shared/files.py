"""Files the training scripts write (checkpoints, loss plots, cost reports), written atomically:
a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import ipujax


def write_atomic(path: Path, write: Callable[[IO[bytes]], Any], suffix: str) -> None:
    """Writes through `write(file)` to a temporary file beside `path`, then renames it over
    `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a plain file is what open() makes
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(path: str, report: ipujax.CostReport) -> None:
    """The step's cost report as JSON (--report)."""
    write_atomic(Path(path), lambda f: f.write(report.to_json().encode()), ".json")

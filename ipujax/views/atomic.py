"""Atomic file writes: a reader sees the old file or the whole new one, never a truncated one.

The text goes to a temporary file in the destination's directory (so that the final rename stays
on one file system), is flushed and fsynced, and `os.replace` puts it in place. If anything fails
before the rename, the temporary file is removed and the destination is untouched.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Writes `data` (text as UTF-8) to `path` atomically; returns the path written."""
    target = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    directory = target.parent if str(target.parent) else Path(".")
    try:
        mode = target.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
            out.flush()
            os.fchmod(out.fileno(), mode)
            os.fsync(out.fileno())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    _fsync_directory(directory)
    return target


def _fsync_directory(directory: Path) -> None:
    """Makes the rename itself durable, where the platform allows opening a directory."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)

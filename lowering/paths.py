"""Source paths as a person names them: relative to the project they work in.

`SourceLoc` keeps the absolute file jax recorded (a compiled program must not depend on where it
was compiled from); whatever puts a location in front of a person shortens it here:
`partitioner.sharding.explain`, ipujax's cost report (and so its JSON) and all of ipujax's views.
It lives in `lowering`, next to `SourceLoc`, so that both later stages can use it without
breaking the one-way layering.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from pathlib import Path

# An installed file: everything up to and including the site-packages folder is noise.
_SITE = re.compile(r"^.*?[/\\](?:site|dist)-packages[/\\]")
# An absolute .py path inside free text ("dot_general at /home/u/model.py:42 over ..."); the
# look-behind keeps it from starting inside a longer word or a relative path.
_PATH_IN_TEXT = re.compile(r"(?<![\w./-])(/[^\s:()\[\],;'\"]+\.py)\b")


def shorten_paths(text: str) -> str:
    """Every absolute .py path inside `text` (a `file:line`, a 'why', an origin) named as a
    person names it; the rest of the text unchanged. A file is named from its package down
    when installed (`flax/linen/linear.py`), else relative to the working directory when under
    it (`examples/gpt/model.py`), else as given.

    Installed files come first so that a virtualenv kept inside the project still reads as the
    package, not as `.venv/lib/python3.11/site-packages/...`. Already short text is unchanged,
    so shortening twice is shortening once."""
    if ".py" not in text:
        return text  # most of a report's text (op names, kinds) names no file
    try:
        cwd = os.getcwd()
    except OSError:  # the working directory was removed: nothing to be relative to
        cwd = ""
    return _shortened_text(text, cwd)


# Cached per working directory: a report repeats a few hundred lines many thousand times, and
# resolving a path asks the file system.
@functools.lru_cache(maxsize=8192)
def _shortened_text(text: str, cwd: str) -> str:
    return _PATH_IN_TEXT.sub(lambda found: _short_path(found.group(1), cwd), text)


@functools.lru_cache(maxsize=4096)
def _short_path(path: str, cwd: str) -> str:
    installed = _SITE.sub("", path)
    if installed != path:
        return installed
    return (_under(path, cwd) if cwd else None) or path


def _under(path: str, cwd: str) -> str | None:
    """`path` relative to `cwd` when inside it, as written or with symlinks resolved."""
    file, root = Path(path), Path(cwd)
    if not file.is_absolute():
        return None  # relative already: relative to the working directory
    candidates = [(file, root)]
    # An unreadable or looping symlink: the path as written only.
    with contextlib.suppress(OSError, RuntimeError):
        candidates.append((file.resolve(), root.resolve()))
    for whole, base in candidates:
        if whole.is_relative_to(base):
            return whole.relative_to(base).as_posix()
    return None

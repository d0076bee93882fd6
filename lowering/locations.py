"""Source locations: the user's file:line that each operation came from.

jax records a Python traceback on every StableHLO op as an MLIR location: a name location holding
the op's name-stack path (`jit(f)/block/dot_general`) around call-site locations whose innermost
callee is the user's own frame. This module decodes that tree with the typed location classes of
jaxlib's MLIR bindings (never by parsing printed text).
"""

from __future__ import annotations

import functools
import os
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jaxlib
from jaxlib.mlir import ir


@dataclass(frozen=True, slots=True)
class SourceLoc:
    """Where an op came from: the user's innermost frame and jax's name-stack path."""

    file: str = ""
    line: int = 0
    column: int = 0
    scope: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.file else "<unknown>"

    @property
    def primitive(self) -> str:
        """The jax primitive name: the last element of the name-stack path."""
        return self.scope.rsplit("/", 1)[-1]


UNKNOWN = SourceLoc()


def _as(cls: type, loc: ir.Location) -> Any:
    """`loc` as a location of kind `cls`, or None. The bindings hand out locations of their
    concrete kind, so an isinstance test answers; a plain `Location` is cast (slowly: a failed
    cast raises)."""
    if isinstance(loc, cls):
        return loc
    if type(loc) is not ir.Location:
        return None
    try:
        return cls(loc)
    except (TypeError, ValueError):
        return None


# ipujax's own packages: a frame in them is never the user's line (jax records it for ops it
# makes outside any user frame, such as constants of its own lowerings).
_OWN_DIRS = tuple(
    str(Path(__file__).resolve().parent.parent / name) + os.sep
    for name in ("lowering", "partitioner", "ipujax")
)


@functools.lru_cache(maxsize=1024)
def _is_own(filename: str) -> bool:
    return str(Path(filename).resolve()).startswith(_OWN_DIRS)


def _first_file(loc: ir.Location) -> tuple[str, int, int] | None:
    """The innermost user file:line:column in a location tree (callee before caller)."""
    if (file := _as(ir.FileLineColLoc, loc)) is not None:
        if _is_own(file.filename):
            return None
        return (file.filename, file.start_line, file.start_col)
    if (name := _as(ir.NameLoc, loc)) is not None:
        return _first_file(name.child_loc)
    if (call := _as(ir.CallSiteLoc, loc)) is not None:
        return _first_file(call.callee) or _first_file(call.caller)
    if (fused := _as(ir.FusedLoc, loc)) is not None:
        for part in fused.locations:
            if (found := _first_file(part)) is not None:
                return found
    return None


def _first_file_kept(
    loc: ir.Location, files: dict[Any, tuple[str, int, int] | None]
) -> tuple[str, int, int] | None:
    """`_first_file`, the answer under a name location's child kept in `files` by the child's
    attribute (uniqued, so equal frames are one key while the module lives)."""
    name = _as(ir.NameLoc, loc)
    if name is None:
        return _first_file(loc)
    child = name.child_loc
    key = child.attr
    if key not in files:
        files[key] = _first_file(child)
    return files[key]


def _outer_name(loc: ir.Location) -> str:
    """The name-stack path that jax puts on the outermost name location."""
    if (name := _as(ir.NameLoc, loc)) is not None:
        return name.name_str
    if (fused := _as(ir.FusedLoc, loc)) is not None:
        for part in fused.locations:
            if found := _outer_name(part):
                return found
    return ""


def decode(
    loc: ir.Location,
    outer: SourceLoc = UNKNOWN,
    files: dict[Any, tuple[str, int, int] | None] | None = None,
) -> SourceLoc:
    """Decodes an op's MLIR location into the user's file:line and the op's scope path; an op
    with no user frame of its own takes the file:line of `outer`, the op or call around it.
    `files`: the file:line found under each name location's child, kept by the caller across
    the locations of one module (its layers share their frames under different scopes)."""
    found = _first_file(loc) if files is None else _first_file_kept(loc, files)
    scope = _outer_name(loc) or outer.scope
    if found is None:
        return SourceLoc(file=outer.file, line=outer.line, column=outer.column, scope=scope)
    return SourceLoc(file=found[0], line=found[1], column=found[2], scope=scope)


# jax's own packages, whose frames a traceback passes through on its way to the user's.
_JAX_DIRS = tuple(
    str(Path(module.__file__).resolve().parent) + os.sep
    for module in (jax, jaxlib)
    if module.__file__ is not None
)


def raised_at(error: BaseException) -> SourceLoc:
    """The user's innermost frame in an error's traceback: the line of theirs that raised it."""
    found = UNKNOWN
    for frame in traceback.extract_tb(error.__traceback__):
        path = str(Path(frame.filename).resolve())
        if not _is_own(frame.filename) and not path.startswith(_JAX_DIRS):
            found = SourceLoc(file=frame.filename, line=frame.lineno or 0)
    return found

"""The workload a SPEC names: `path/to/file.py:NAME` or `package.module:NAME` loaded, NAME called
(with `mesh=` when it takes one) and what it returns checked to be `(fun, args)` or
`(fun, args, jit_kwargs)`. Every mistake is a `CliError` naming the spec."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ipujax.api import jit
from ipujax.cli.errors import CliError
from partitioner import Mesh

_JIT_KEYWORDS = frozenset(inspect.signature(jit).parameters) - {"fun"}
_SHAPE = "it must return (fun, args) or (fun, args, jit_kwargs)"


@dataclass(frozen=True)
class Workload:
    fun: Callable[..., Any]
    args: tuple[Any, ...]
    jit_kwargs: dict[str, Any]


def _load_file(path: Path, spec: str) -> ModuleType:
    if not path.is_file():
        raise CliError(f"spec {spec!r}: no such file {str(path)!r}")
    resolved = path.resolve()
    name = "_ipujax_spec_" + re.sub(r"\W", "_", resolved.stem)
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise CliError(f"spec {spec!r}: cannot load {str(path)!r} as Python")
    folder = str(resolved.parent)
    if folder not in sys.path:  # as `python file.py` would: its siblings import
        sys.path.insert(0, folder)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _import_module(dotted: str, spec: str) -> ModuleType:
    if not all(part.isidentifier() for part in dotted.split(".")):
        raise CliError(f"spec {spec!r}: {dotted!r} is neither a .py file nor a module name")
    if os.getcwd() not in sys.path and "" not in sys.path:  # as `python -m` would
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if missing and (dotted == missing or dotted.startswith(missing + ".")):
            raise CliError(f"spec {spec!r}: no module named {missing!r}") from None
        raise  # the workload itself imports something missing: its own traceback helps


def load_spec(spec: str) -> Callable[..., Any]:
    """The callable that `path/to/file.py:NAME` or `package.module:NAME` names."""
    location, sep, name = spec.rpartition(":")
    if not sep or not location or not name:
        raise CliError(f"spec {spec!r}: expected path/to/file.py:NAME or package.module:NAME")
    if not all(part.isidentifier() for part in name.split(".")):
        raise CliError(f"spec {spec!r}: {name!r} is not a Python name")
    if location.endswith(".py") or "/" in location or os.sep in location:
        module = _load_file(Path(location), spec)
    else:
        module = _import_module(location, spec)
    target: Any = module
    for part in name.split("."):
        if not hasattr(target, part):
            raise CliError(f"spec {spec!r}: {location} has no attribute {name!r}")
        target = getattr(target, part)
    if not callable(target):
        raise CliError(
            f"spec {spec!r}: {name} is a {type(target).__name__}, not a callable that "
            "returns (fun, args) or (fun, args, jit_kwargs)"
        )
    return target


def accepts_mesh(factory: Callable[..., Any]) -> bool:
    try:
        parameter = inspect.signature(factory).parameters.get("mesh")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def call_workload(
    factory: Callable[..., Any], spec: str, mesh: Mesh | None, **extra: Any
) -> Workload:
    """Calls the spec's callable (with `mesh=` when given, and `extra` keywords) and checks
    what it returns."""
    kwargs = ({} if mesh is None else {"mesh": mesh}) | extra
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError:
        what = "with mesh=... only" if kwargs else "without arguments"
        raise CliError(f"spec {spec!r}: it must be callable {what}") from None
    except ValueError:
        pass  # no signature to check (a builtin): just call it
    return _checked_workload(factory(**kwargs), spec)


@contextlib.contextmanager
def mesh_refusals(spec: str, mesh: Mesh) -> Iterator[None]:
    """A workload's refusal of the one mesh the user gave it (its `ValueError` or
    `NotImplementedError`, which `ipujax plan` reads as a mesh to skip) as a `CliError` naming
    the line that raised it."""
    try:
        yield
    except (ValueError, NotImplementedError) as error:
        raise CliError(_refusal(spec, mesh, error)) from None


def _refusal(spec: str, mesh: Mesh, error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    axes = ",".join(f"{name}={size}" for name, size in mesh.shape.items())
    return (
        f"spec {spec!r} refuses the mesh {axes}: {type(error).__name__}: {error}{where}; "
        "give a mesh it can split over"
    )


def _checked_workload(result: Any, spec: str) -> Workload:
    """What the spec's callable returned, as a `Workload`, once its shape and types are right."""
    if not isinstance(result, (tuple, list)) or len(result) not in (2, 3):
        got = f"{len(result)} items" if isinstance(result, (tuple, list)) else type(result).__name__
        raise CliError(f"spec {spec!r} returned {got}; {_SHAPE}")
    fun, args = result[0], result[1]
    jit_kwargs = result[2] if len(result) == 3 else {}
    if not callable(fun):
        raise CliError(f"spec {spec!r}: fun is a {type(fun).__name__}, not callable; {_SHAPE}")
    if not isinstance(args, (tuple, list)):
        raise CliError(f"spec {spec!r}: args is a {type(args).__name__}, not a tuple; {_SHAPE}")
    if not isinstance(jit_kwargs, dict):
        raise CliError(f"spec {spec!r}: jit_kwargs is a {type(jit_kwargs).__name__}, not a dict")
    unknown = sorted(str(k) for k in jit_kwargs if k not in _JIT_KEYWORDS)
    if unknown:
        raise CliError(
            f"spec {spec!r}: jit_kwargs has {unknown}, which ipujax.jit does not take "
            f"(it takes {sorted(_JIT_KEYWORDS)})"
        )
    _check_arguments(fun, tuple(args), spec)
    return Workload(fun, tuple(args), dict(jit_kwargs))


def _check_arguments(fun: Callable[..., Any], args: tuple, spec: str) -> None:
    """`fun` takes the arguments the spec gives it, or the spec is wrong: said in one line,
    naming the function's file:line, rather than in the traceback of a trace that fails."""
    try:
        signature = inspect.signature(fun)
    except (TypeError, ValueError):
        return  # no signature to check (a builtin, a wrapped callable): the trace will tell
    try:
        signature.bind(*args)
    except TypeError as error:
        code = getattr(inspect.unwrap(fun), "__code__", None)
        where = "" if code is None else f" ({code.co_filename}:{code.co_firstlineno})"
        raise CliError(
            f"spec {spec!r}: its fun{where} does not take the {len(args)} arguments it "
            f"returns: {error}; return (fun, args) with one argument per parameter"
        ) from None

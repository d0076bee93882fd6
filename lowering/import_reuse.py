"""Imports kept for lowerings that would make them again, inside a `with imports_reused():`
block (`partitioner.reuse.reusing()`, the plan search's, opens one): the search lowers one
model once per mesh, and most meshes give the same StableHLO module (BERT-Large on a Pod16:
10 full-depth lowerings, 4 distinct modules), each of which took as long to import as jax
took to lower it.

A module is known by its contents, locations included (everything the importer reads), so a
kept `Graph` is exactly what importing the module again would make. A module with host callbacks is
never kept: its graph holds that lowering's Python functions. Outside a block nothing is kept
and nothing is written out, so a user's compile pays nothing for this.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from lowering.ir import Graph


@dataclass
class KeptImports:
    """Imported graphs by their module's digest; `made` and `reused` count misses and hits."""

    graphs: dict[bytes, Graph] = field(default_factory=dict)
    made: int = 0
    reused: int = 0

    def get(self, contents: bytes, make: Callable[[], Graph]) -> Graph:
        key = hashlib.blake2b(contents, digest_size=20).digest()
        if key in self.graphs:
            self.reused += 1
            return self.graphs[key]
        self.made += 1
        graph = self.graphs[key] = make()
        return graph


_ACTIVE: ContextVar[KeptImports | None] = ContextVar("lowering_import_reuse", default=None)


@contextlib.contextmanager
def imports_reused(store: KeptImports | None = None) -> Iterator[KeptImports]:
    """Within the block, a module imported once is not imported again: kept in `store` when
    given (which outlives the block: a plan-search worker's, across its jobs), else in the
    outer block's, else in a new one."""
    outer = _ACTIVE.get()
    if store is None and outer is not None:
        yield outer
        return
    store = KeptImports() if store is None else store
    token = _ACTIVE.set(store)
    try:
        yield store
    finally:
        _ACTIVE.reset(token)


def imported(module: Any, callbacks: tuple[Any, ...], make: Callable[[], Graph]) -> Graph:
    """`make()`, or within an `imports_reused` block the graph it made for the same module."""
    store = _ACTIVE.get()
    if store is None or callbacks:
        return make()
    return store.get(_contents(module), make)


def _contents(module: Any) -> bytes:
    """The module as MLIR bytecode: all of it (locations and resources included), which reads
    back as the same module, written in a tenth of the time its text takes (BERT-Large's
    micro-batch: 0.02-0.04 s against 0.26-0.36 s)."""
    out = io.BytesIO()
    module.operation.write_bytecode(out)
    return out.getvalue()

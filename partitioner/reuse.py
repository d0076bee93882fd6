"""What the passes made, kept for builds that would make it again, inside a `with reusing():`
block (the plan search's): a pipelined mesh is built stashing and recomputing, and everything
before the stage split (partition, schedule, the split itself) is the same for both. The block
also keeps the importer's graphs (`lowering.import_reuse`): most of a search's meshes lower to
the same module.

A result is kept under every input that determines it: objects compared by identity are held
with it, so no other object can take their `id` while it is kept; everything else is compared by
equality. Inputs that cannot be hashed are not kept. Outside a block nothing is kept, so a
user's compile never reads a result made for another.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from lowering import imports_reused

T = TypeVar("T")


@dataclass
class Kept:
    """Results by key, the most recent `capacity` of them (each with the objects its key
    names by identity); `made` and `reused` count the misses and hits."""

    capacity: int = 1
    entries: OrderedDict[Hashable, tuple[Any, tuple[Any, ...]]] = field(default_factory=OrderedDict)
    made: int = 0
    reused: int = 0

    def get(self, key: Hashable, held: tuple[Any, ...], make: Callable[[], T]) -> T:
        if key in self.entries:
            self.entries.move_to_end(key)
            self.reused += 1
            result: T = self.entries[key][0]
            return result
        result = make()
        self.made += 1
        self.entries[key] = result, held
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)
        return result


_ACTIVE: ContextVar[Kept | None] = ContextVar("partitioner_reuse", default=None)


@contextlib.contextmanager
def reusing(capacity: int = 1) -> Iterator[Kept]:
    """Within the block, results the passes make are kept for builds with the same inputs (the
    most recent `capacity`: a plan search builds one mesh's variants one after another), and
    the importer's graphs for lowerings of the same module (`lowering.imports_reused`)."""
    store = Kept(capacity)
    token = _ACTIVE.set(store)
    try:
        with imports_reused():
            yield store
    finally:
        _ACTIVE.reset(token)


def kept(key: Hashable, held: tuple[Any, ...], make: Callable[[], T]) -> T:
    """`make()`, or inside a `reusing` block the result kept under `key` (which must name every
    input `make` reads: the objects in `held` by their `id`, the rest by value)."""
    store = _ACTIVE.get()
    if store is None:
        return make()
    try:
        hash(key)
    except TypeError:  # a list among the options (a pipeline's stages, phases by name)
        return make()
    return store.get(key, held, make)

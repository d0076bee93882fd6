"""The result types of the ops the partitioner emits, inferred once per form of op.

Every op of the per-IPU program has its types inferred by its shape rule
(`lowering.infer_types`), and a program repeats a few forms of op over its layers: the same op
on operands of the same shapes and dtypes with the same attributes. A shape rule reads exactly
those (and the regions, which compare by identity), so its answer is kept per form. A small
array attribute (a constant's scalar) counts by its contents; an op with a larger one, or any
other attribute that does not hash, is inferred each time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lowering import Graph, Op, SourceLoc, Value, infer_types

_SMALL_ARRAY = 64  # elements: larger arrays are not copied into keys


class TypeCache:
    """Result types by op form, for the life of one partitioning."""

    def __init__(self) -> None:
        self.known: dict[tuple, tuple[Any, ...]] = {}

    def infer(
        self,
        name: str,
        operands: Sequence[Value],
        attrs: Mapping[str, Any],
        regions: tuple[Graph, ...],
        loc: SourceLoc,
    ) -> tuple[Any, ...]:
        """`infer_types` of the op `name` on `operands` (`loc` only names it in errors)."""
        types = tuple([(v.shape, v.dtype) for v in operands])
        key = (name, types, tuple(attrs.items()), regions)
        found = self._get(key)
        if found is _UNHASHABLE:  # an attribute that does not hash: an array, by its contents
            key = (name, types, tuple((k, _contents(v)) for k, v in attrs.items()), regions)
            found = self._get(key)
        if found is None or found is _UNHASHABLE:
            types_found = infer_types(Op(name, tuple(operands), (), attrs, regions, loc))
            if found is None:
                self.known[key] = types_found
            return types_found
        return found

    def _get(self, key: tuple) -> Any:
        """The types kept under `key`, None if none are, `_UNHASHABLE` if it cannot be a key."""
        try:
            return self.known.get(key)
        except TypeError:
            return _UNHASHABLE


_UNHASHABLE = object()


def _contents(value: Any) -> Any:
    """A small array as its type, shape and bytes, which tell it from any other; anything else
    as it is."""
    if isinstance(value, np.ndarray) and value.size <= _SMALL_ARRAY:
        return (np.ndarray, value.dtype, value.shape, value.tobytes())
    return value

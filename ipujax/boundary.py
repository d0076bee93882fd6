"""The API boundary: ipujax's own errors reach the user without ipujax's internal frames.

Like jax's `api_boundary`, an `IpujaxError` raised anywhere below a public entry point is
re-raised from that entry point with its internal traceback dropped, so the user sees their own
call and the message (which names their file:line). Set IPUJAX_TRACEBACK_FILTERING=off to keep
the full traceback when debugging ipujax itself.

Each entry point also runs with Python's cyclic garbage collector paused. Lowering and compiling
build millions of small records that live until the compile ends; with the collector on, each of
its generation sweeps walked all of them again, a third of GPT-3's compile on a Pod256 (26 s
against 18 s). Garbage without cycles is still freed at once (a compile makes no cycles of its
own: a test checks), and the collector, on again when the entry point returns, finds the rest
at its next sweep. When the block made more objects than the collector's youngest sweep
takes (a lower, a compile; not a warm call), what it made and kept is handed to the collector's
oldest generation as it ends (`gc.freeze` then `gc.unfreeze`): otherwise the collector's first
sweeps after it walked every new object twice more, young then middle-aged (GPT-3 on a Pod256:
0.3 s after the lower, 0.7 and 1.0 s after the compile).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from lowering import IpujaxError

F = TypeVar("F", bound=Callable[..., Any])


def api_boundary(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with collector_paused():
                return fn(*args, **kwargs)
        except IpujaxError as error:
            if os.environ.get("IPUJAX_TRACEBACK_FILTERING", "on") == "off":
                raise
            raise error.with_traceback(None) from None

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off until the block ends (nested blocks: until the
    outermost ends)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        # Only after a burst (a lower, a compile): a warm call leaves a few objects, and aging
        # the user's own young ones with them at every step would keep their cycles from the
        # young sweeps that free them.
        if gc.get_count()[0] > gc.get_threshold()[0]:
            gc.freeze()  # everything the collector tracks, to the permanent generation,
            gc.unfreeze()  # and back into the oldest one: none walked again until a full sweep
        gc.enable()

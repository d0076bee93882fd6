"""The API boundary: ipujax's own errors reach the user without ipujax's internal frames.

Like jax's `api_boundary`, an `IpujaxError` raised anywhere below a public entry point is
re-raised from that entry point with its internal traceback dropped, so the user sees their own
call and the message (which names their file:line). Set IPUJAX_TRACEBACK_FILTERING=off to keep
the full traceback when debugging ipujax itself.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

from lowering import IpujaxError

F = TypeVar("F", bound=Callable[..., Any])


def api_boundary(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except IpujaxError as error:
            if os.environ.get("IPUJAX_TRACEBACK_FILTERING", "on") == "off":
                raise
            raise error.with_traceback(None) from None

    return wrapper  # type: ignore[return-value]

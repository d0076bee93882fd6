"""Worker processes for the plan search: candidates that do not depend on one another costed
side by side, one process per core.

A search's compiles are Python from end to end (jax's trace, the import, the passes), so
threads would take turns; processes do not. Workers are spawned, never forked: jax runs threads
of its own, and a fork of a process that has them may deadlock. Each worker is set up once by
`setup()` (made in the parent, pickled: a module-level function and plain values), which
remakes the model in the worker and returns what it does with each job; the jobs and their
results travel pickled, in the parent's order.

The parent asks for no more than what it sends: `costed` returns each job's result in the
order the jobs were given, and `None` for the whole batch when a worker could not be started
or died, with a warning (the search then does the work itself, so an error is raised where it
arises, typed, with its own traceback).
"""

from __future__ import annotations

import multiprocessing
import os
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

# Worker processes by default at most: each holds a candidate's programs (BERT-Large's pipelined
# micro-batch: about 1.3 GB), so a wide machine is not filled by default.
MAX_JOBS = 4

# The worker's own: what it does with a job, made by the pool's `setup` when it starts.
_JOB: Callable[[Any], Any] | None = None


def _start(setup: Callable[[], Callable[[Any], Any]]) -> None:
    global _JOB
    _JOB = setup()


def _run(job: Any) -> Any:
    assert _JOB is not None, "a worker runs jobs only after its setup"
    return _JOB(job)


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the platform says)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_jobs() -> int:
    """`ipujax plan`'s workers unless told: the usable cores, at most `MAX_JOBS`."""
    return min(usable_cores(), MAX_JOBS)


class Workers:
    """`jobs` worker processes, started on first use and stopped by `close`."""

    def __init__(self, jobs: int, setup: Callable[[], Callable[[Any], Any]]) -> None:
        self.jobs = jobs
        self._setup = setup
        self._pool: ProcessPoolExecutor | None = None
        self.broken: BaseException | None = None  # why the pool stopped, once it has

    def costed(self, jobs: Sequence[Any]) -> list[Any] | None:
        """Each job's result, in order; None when the pool is broken (see the module's
        docstring), and from then on."""
        if self.broken is not None:
            return None
        if self._pool is None:
            spawn = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                self.jobs, mp_context=spawn, initializer=_start, initargs=(self._setup,)
            )
        try:
            return list(self._pool.map(_run, jobs))
        # The jobs catch their own errors (`setup`'s job returns what says so): what reaches
        # here is the pool's (a worker killed, its setup failing, a value that cannot pickle).
        except Exception as error:
            self.broken = error
            self.close()
            warnings.warn(
                f"the plan search's worker processes stopped ({type(error).__name__}: {error}); "
                "the search goes on in this process alone (--jobs 1 does so from the start)",
                RuntimeWarning,
                stacklevel=2,
            )
            return None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

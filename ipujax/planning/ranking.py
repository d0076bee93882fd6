"""The plan search's results: a costed `Plan` (its figures, and `ipujax.jit`'s keywords to run
it), the candidates it did not cost (`Skipped`, and why), the ranked `Plans` and the ranking:
plans that fit first, then by samples per second."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ipujax.api import jit
from ipujax.errors import ConfigError
from ipujax.planning.candidates import Candidate
from ipujax.planning.models import Made
from partitioner import Pipeline


@dataclass(frozen=True)
class Plan:
    """A costed plan. `jit_kwargs` are `ipujax.jit`'s keywords for it (mesh, in_shardings and
    the options); `extrapolated` says its figures come from shallower copies of the model."""

    candidate: Candidate
    predicted_seconds: float
    samples: int
    fits: bool
    peak_tile_bytes: int
    bytes_per_tile: int
    collective_share: float
    streaming_share: float
    extrapolated: bool
    pipeline: Pipeline | None = None
    # Built when asked for: a layered workload's plan is costed shallow, applied whole.
    build: Callable[[], Made] | None = field(default=None, repr=False, compare=False)

    @property
    def jit_kwargs(self) -> dict[str, Any]:
        """`ipujax.jit`'s keywords for this plan: mesh, in_shardings, phases, pipeline."""
        return self.build()[2] if self.build is not None else {}

    @property
    def args(self) -> tuple:
        """The arguments of the step this plan was costed for (a workload's batch may differ
        from mesh to mesh)."""
        return self.build()[1] if self.build is not None else ()

    @property
    def mesh(self) -> dict[str, int]:
        return self.candidate.mesh

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.predicted_seconds if self.predicted_seconds > 0 else 0.0

    def jit(self, fun: Callable[..., Any], **kwargs: Any) -> Any:
        """`ipujax.jit(fun)` with this plan's mesh, shardings and options (and `kwargs`)."""
        return jit(fun, **{**self.jit_kwargs, **kwargs})

    def to_dict(self) -> dict[str, Any]:
        c = self.candidate
        return {
            "mesh": self.mesh,
            "phases": c.phases,
            "pipeline": _pipeline_dict(self.pipeline),
            "predicted_seconds": self.predicted_seconds,
            "samples_per_step": self.samples,
            "samples_per_second": self.samples_per_second,
            "fits": self.fits,
            "peak_tile_bytes": self.peak_tile_bytes,
            "bytes_per_tile": self.bytes_per_tile,
            "collective_share": self.collective_share,
            "streaming_share": self.streaming_share,
            "extrapolated": self.extrapolated,
        }


@dataclass(frozen=True)
class Skipped:
    """A candidate the search did not cost, the kind of reason and the reason in words."""

    candidate: Candidate
    reason: str  # "not expressible", "memory bound", "dominated" or "cost bound"
    detail: str


@dataclass(frozen=True)
class Plans:
    """The ranked plans (fitting first, then by samples per second) and what was not costed."""

    system: str
    ipus: int
    target: str
    plans: tuple[Plan, ...]
    skipped: tuple[Skipped, ...]
    compiles: int  # cost-only compiles the search ran (shallow copies included)

    @property
    def best(self) -> Plan:
        if not self.plans:
            raise ConfigError(
                f"no plan for a {self.system} could be costed: "
                + "; ".join(f"{s.candidate.describe()}: {s.detail}" for s in self.skipped[:4])
            )
        return self.plans[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "ipus": self.ipus,
            "target": self.target,
            "compiles": self.compiles,
            "plans": [dict(rank=i + 1, **p.to_dict()) for i, p in enumerate(self.plans)],
            "skipped": [
                {
                    "mesh": s.candidate.mesh,
                    "phases": s.candidate.phases,
                    "microbatches": s.candidate.microbatches,
                    "recompute": s.candidate.recompute,
                    "reason": s.reason,
                    "detail": s.detail,
                }
                for s in self.skipped
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)


def _pipeline_dict(pipeline: Pipeline | None) -> dict[str, Any] | None:
    if pipeline is None:
        return None
    return {
        "axis": pipeline.axis,
        "microbatches": pipeline.microbatches,
        "recompute": pipeline.recompute,
        "optimizer_state_offchip": pipeline.optimizer_state_offchip,
    }


def rank(plans: Sequence[Plan]) -> list[Plan]:
    """Fitting plans first, each group by samples per second, fastest first."""
    return sorted(plans, key=lambda p: (not p.fits, -p.samples_per_second))

"""The ranked plans of `ipujax plan` as terminal tables (rich)."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table

from ipujax.planning import Plan, Plans


def _mesh(plan: Plan) -> str:
    return " x ".join(f"{name} {size}" for name, size in plan.candidate.axes)


def _options(plan: Plan) -> str:
    c = plan.candidate
    parts = []
    if c.phases:
        parts.append(f"phases {c.phases}")
    pipeline = plan.pipeline
    if pipeline is not None:
        parts.append(f"{pipeline.microbatches} micro-batches")
        parts.append("recompute" if pipeline.recompute else "stash")
    return ", ".join(parts) or "-"


def plans_table(plans: Plans, top: int) -> Table:
    table = Table(
        title=f"Plans for a {plans.system} ({plans.ipus} {plans.target} IPUs), fitting first, "
        "fastest first",
        title_justify="left",
        box=None,
        header_style="bold",
    )
    for name in (
        "#",
        "mesh",
        "options",
        "step",
        "samples/s",
        "peak tile",
        "fits",
        "links",
        "streaming",
    ):
        table.add_column(name, justify="left" if name in ("mesh", "options") else "right")
    for i, plan in enumerate(plans.plans[:top], start=1):
        estimate = " ~" if plan.extrapolated else ""
        table.add_row(
            str(i),
            _mesh(plan),
            _options(plan),
            f"{plan.predicted_seconds * 1e3:,.2f} ms{estimate}",
            f"{plan.samples_per_second:,.1f}",
            f"{plan.peak_tile_bytes:,} B",
            "yes" if plan.fits else "NO",
            f"{plan.collective_share:.0%}",
            f"{plan.streaming_share:.0%}",
        )
    return table


def skipped_lines(plans: Plans) -> list[str]:
    counts = Counter(s.reason for s in plans.skipped)
    if not counts:
        return []
    text = ", ".join(f"{n} {reason}" for reason, n in counts.most_common())
    return [f"not costed: {text} (--json lists each with its reason)"]


def apply_line(plans: Plans, spec: str) -> str:
    best = plans.best
    mesh = ",".join(f"{n}={s}" for n, s in best.candidate.axes)
    command = f"ipujax cost-report {spec} --mesh {mesh} --target {plans.target}"
    if best.candidate.phases:
        command += f" --phases {best.candidate.phases}"
    return f"best: {command}"


def render_plans(console: Console, plans: Plans, spec: str, top: int = 10) -> None:
    console.print(plans_table(plans, top))
    shown = plans.plans[:top]
    estimate = (
        "~ extrapolated from shallower copies of the model; "
        if any(p.extrapolated for p in shown)
        else ""
    )
    console.print(f"{estimate}{plans.compiles} cost-only compiles", style="dim")
    for line in skipped_lines(plans):
        console.print(line, style="dim")
    if plans.plans:
        console.print(apply_line(plans, spec))

"""The spmd section: XLA's SPMD partitioner on the GPT step with ipujax's PartitionSpecs, over
forced host devices in a child process per mesh (`child_xla`), beside ipujax's figures from the
run section: warm call, collectives and bytes per device as `spmd_compare.py` counts them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import jax
import numpy as np
import spmd_compare
from jax.sharding import PartitionSpec as P
from measuring import log, run_child, timed, warm_up_jax
from programs import gpt_step
from results import Section, goal, markdown_table
from setups import MeshSpec, Setup, setup_payload
from timing import MeshRun

import ipujax

# Issue 20's goal: on 64 IPUs, ipujax's warm call at least 1.5x faster than XLA SPMD's.
SPMD_SPEEDUP_GOAL = 1.5  # XLA SPMD warm call / ipujax warm call
SPMD_GOAL_IPUS = 64  # judged on meshes of at least this many IPUs


def child_xla(payload: dict[str, Any]) -> dict[str, Any]:
    """The GPT step under jax.jit with NamedShardings over forced host devices (XLA's SPMD
    partitioner), with the PartitionSpecs ipujax gets: compile, warm calls, collectives."""
    from jax.sharding import Mesh, NamedSharding

    spec = MeshSpec(tuple(payload["shape"]), tuple(payload["names"]))
    step = gpt_step(payload["config"], payload["batch"])
    in_specs, out_specs = step.specs(ipujax.make_mesh(spec.shape, spec.names))
    devices = jax.devices()
    if len(devices) < spec.ipus:
        raise RuntimeError(f"{spec.label} needs {spec.ipus} devices, jax has {len(devices)}")
    mesh = Mesh(np.asarray(devices[: spec.ipus]).reshape(spec.shape), spec.names)

    def shardings(tree: Any) -> Any:
        return jax.tree.map(
            lambda s: NamedSharding(mesh, s), tree, is_leaf=lambda s: isinstance(s, P)
        )

    warm_up_jax()
    jitted = jax.jit(
        step.fresh(), in_shardings=shardings(in_specs), out_shardings=shardings(out_specs)
    )
    compile_, executable = timed(lambda: jitted.lower(*step.args).compile(), block=False)
    args = jax.device_put(step.args, shardings(in_specs))
    first, out = timed(lambda: executable(*args))
    warm = [timed(lambda: executable(*args))[0] for _ in range(payload["repeats"])]
    collectives = spmd_compare.hlo_collectives(executable, spec.ipus)
    return {
        "compile": compile_,
        "first": first,
        "warm": warm,
        "loss": float(out[2]),
        "collectives": [asdict(c) for c in collectives],
    }


def spmd_section(setup: Setup, runs: Sequence[MeshRun], repeats: int) -> Section:
    header = (
        "mesh",
        "XLA compile s",
        "XLA SPMD s",
        "ipujax s",
        "XLA / ipujax",
        f"goal >= {SPMD_SPEEDUP_GOAL} ({SPMD_GOAL_IPUS} IPUs)",
        "XLA collectives",
        "XLA B/device",
        "ipujax collectives",
        "ipujax B/IPU",
        "bytes ipujax/XLA",
        "loss diff",
    )
    rows, notes, goals = [], [], []
    for r in runs:
        log(f"spmd: {r.mesh.label}: XLA's SPMD partitioner in a child process")
        payload = {**setup_payload(setup), "shape": r.mesh.shape, "names": r.mesh.names}
        data = run_child("xla", {**payload, "repeats": repeats}, devices=r.mesh.ipus)
        xla = spmd_compare.Side(tuple(spmd_compare.Collective(**c) for c in data["collectives"]))
        ours = spmd_compare.Side(tuple(r.collectives))
        ratio = ours.bytes / xla.bytes if xla.bytes else math.inf
        speedup = statistics.median(data["warm"]) / r.ipujax_median
        judged = r.mesh.ipus >= SPMD_GOAL_IPUS
        if judged:
            goals.append(
                (
                    f"ipujax against XLA's SPMD partitioner, {r.mesh.label}: {speedup:.2f}x faster",
                    speedup >= SPMD_SPEEDUP_GOAL,
                )
            )
        notes.append(f"{r.mesh.label}, bytes per device by kind: {by_kind(xla, ours)}")
        rows.append(
            (
                r.mesh.label,
                f"{data['compile']:.2f}",
                f"{statistics.median(data['warm']):.3f}",
                f"{r.ipujax_median:.3f}",
                f"{speedup:.2f}",
                goal(speedup >= SPMD_SPEEDUP_GOAL) if judged else "",
                xla.counts_text(),
                f"{xla.bytes:,}",
                ours.counts_text(),
                f"{ours.bytes:,}",
                f"{ratio:.2f}",
                f"{abs(data['loss'] - r.loss):.1e}",
            )
        )
    meaning = (
        "XLA's SPMD partitioner on the same step with the same PartitionSpecs (the parameters and "
        "optimizer state as `examples/gpt/sharding.py` shards them, tokens over dp; outputs "
        "pinned to the inputs' specs on both sides, the loss replicated), as `jax.jit` with "
        "`NamedSharding`s over a `jax.sharding.Mesh` of that many forced host devices (a child "
        "process started with `XLA_FLAGS=--xla_force_host_platform_device_count=N`). XLA compile "
        f"s: its lower + compile; XLA SPMD s: the median of {repeats} warm calls, every device "
        "sharing this machine's cores; ipujax s: the run table's figure; XLA / ipujax: how many "
        "times faster ipujax's warm call is. Collectives by kind "
        "(XLA: instructions of the partitioned HLO, which its combiner may have merged; ipujax: "
        "collective ops) and bytes each device sends over a program step, both by the ring "
        "closed forms of `partitioner.ring_bytes`, as `benchmarks/spmd_compare.py` counts "
        "them. loss diff: |XLA SPMD's loss - jax.jit's|."
    )
    title = "XLA's SPMD partitioner on the same steps"
    table = markdown_table(header, rows)
    return Section("spmd", title, table, meaning, tuple(goals), notes=tuple(notes))


def by_kind(xla: spmd_compare.Side, ours: spmd_compare.Side) -> str:
    """Each side's bytes per device by collective kind, as text."""
    return "; ".join(
        f"{label} " + ", ".join(f"{kind} {sent:,}" for kind, sent in side.bytes_by_kind.items())
        for label, side in (("XLA", xla), ("ipujax", ours))
    )

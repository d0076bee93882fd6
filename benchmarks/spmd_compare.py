"""ipujax's partitioner against XLA's own SPMD partitioner: collectives and bytes per device.

Each case is one program with one set of PartitionSpecs (inputs and outputs pinned alike on both
sides). It is compiled twice:

* XLA: `jax.jit(f, in_shardings=NamedSharding(...), out_shardings=...)` over a
  `jax.sharding.Mesh` of forced host devices, `.lower(*args).compile()`. The forced device count
  (`XLA_FLAGS=--xla_force_host_platform_device_count=8`) must be set before jax starts, so this
  side runs in a child process (this file with `--xla-child`), which prints JSON.
* ipujax: `ipujax.jit(f, mesh=ipujax.make_mesh(...), in_shardings=..., out_shardings=...)` on a
  small Bow target; its collectives are `Compiled.cost_report().collectives`.

What is counted on the XLA side: every collective instruction in the compiled, partitioned HLO
modules (`runtime_executable().hlo_modules()`, every computation's instructions, matched by
opcode): all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute and the async
`-start` forms of the first, second and last (a `-done` is the same collective and is not
counted again). Each is one static instruction, counted once even when XLA's combiner merged
several buffers into one tuple-shaped collective; the bytes of such a collective are those of its
element buffers, each by the closed form below, summed (as if uncombined, like ipujax's). The
group size n comes from `replica_groups` (explicit `{{...}}`, iota `[g,n]<=[...]`, or the
named-mesh form `mesh[...] {axes}`; empty means all partitions).

Both sides are measured with one yardstick, `partitioner.ring_bytes`: the bytes each
device sends in a ring over its group for a buffer of N bytes, where N is the operand for
all-reduce and all-to-all, the gathered result for all-gather and the whole input (result x n)
for reduce-scatter. A collective-permute has no ring: each source device sends its buffer once
(N bytes, the busiest device's figure; n is printed as 2, a source and its target). ipujax
reports the same figure as `bytes_per_ipu`; the XLA figure is recomputed here from each
instruction's result shape. Bytes are per device, summed over the program's collectives; the
collective counts are instructions (XLA) and collective ops (ipujax), so they differ by combining.

    python benchmarks/spmd_compare.py            # every case, a table
    python benchmarks/spmd_compare.py ffn-dp -v  # one case, every collective listed
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO, REPO / "examples"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from partitioner import ring_bytes  # noqa: E402

DEVICES = 8  # forced host devices in the XLA child
TILES = 64  # tiles per IPU of the ipujax target (a small Bow)

# ---- the programs ---------------------------------------------------------------------------

BATCH, D_MODEL, D_FF = 64, 32, 128  # the FFN's shapes: x [BATCH, D_MODEL], w1 [D_MODEL, D_FF]


def ffn_loss(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    return jnp.mean((jax.nn.gelu(x @ w1) @ w2) ** 2)


Built = tuple[Callable[..., Any], tuple[Any, ...], Any, Any]  # fun, args, in specs, out specs


def _ffn(specs: tuple[P, P, P]) -> Callable[[], Built]:
    """Forward and backward of the FFN wrt x, w1, w2; each gradient keeps its input's spec."""

    def build() -> Built:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((BATCH, D_MODEL), np.float32)
        w1 = 0.1 * rng.standard_normal((D_MODEL, D_FF), np.float32)
        w2 = 0.1 * rng.standard_normal((D_FF, D_MODEL), np.float32)
        fun = jax.value_and_grad(ffn_loss, argnums=(0, 1, 2))
        return fun, (x, w1, w2), specs, (P(), specs)

    return build


def _gpt_param_specs(params: Any, tp: str) -> Any:
    """Megatron: qkv and fc split by columns, proj and out by rows; the rest replicated."""
    megatron = {"qkv": P(None, tp), "proj": P(tp, None), "fc": P(None, tp), "out": P(tp, None)}
    blocks = [{k: megatron.get(k, P()) for k in block} for block in params["blocks"]]
    return {"wte": P(), "wpe": P(), "blocks": blocks, "lnf": P()}


def _like_params(state: Any, params: Any, param_specs: Any) -> Any:
    """Specs for an optimizer state: a leaf whose path ends in a parameter's path (Adam's mu and
    nu) gets that parameter's spec; every other leaf (the step count) is replicated."""
    by_path = {
        tuple(path): spec
        for (path, _), spec in zip(
            jax.tree_util.tree_flatten_with_path(params)[0],
            jax.tree.leaves(param_specs, is_leaf=lambda s: isinstance(s, P)),
            strict=True,
        )
    }

    def spec(path: tuple, _: Any) -> P:
        for start in range(len(path)):
            if tuple(path[start:]) in by_path:
                return by_path[tuple(path[start:])]
        return P()

    return jax.tree_util.tree_map_with_path(spec, state)


def _gpt() -> Built:
    """The tiny GPT's AdamW step; dp x tp: tokens split by batch, Megatron weights, Adam's
    moments sharded like their parameters, outputs pinned to the inputs' specs."""
    import tiny_gpt

    params, opt_state, tokens = tiny_gpt.example(batch=4)
    param_specs = _gpt_param_specs(params, "tp")
    state_specs = _like_params(opt_state, params, param_specs)
    in_specs = (param_specs, state_specs, P("dp"))
    out_specs = (param_specs, state_specs, P())
    return tiny_gpt.train_step, (params, opt_state, tokens), in_specs, out_specs


@dataclass(frozen=True)
class Case:
    name: str
    program: str
    strategy: str
    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    build: Callable[[], Built]
    # (kind, bytes): both sides must have a collective of this kind, with buffers (N) of at
    # least this many bytes in all; the test checks it
    expect: tuple[tuple[str, int], ...] = ()

    @property
    def mesh(self) -> str:
        return " x ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.mesh_shape, strict=True))


CASES: dict[str, Case] = {
    case.name: case
    for case in (
        Case(
            "ffn-dp",
            "FFN fwd+bwd",
            "DP: x P(dp)",
            (4,),
            ("dp",),
            _ffn((P("dp"), P(), P())),
            expect=(("all_reduce", 4 * 2 * D_MODEL * D_FF),),  # the weights' gradients
        ),
        Case(
            "ffn-megatron",
            "FFN fwd+bwd",
            "Megatron 1D: w1 P(,tp) w2 P(tp,)",
            (4,),
            ("tp",),
            _ffn((P(), P(None, "tp"), P("tp", None))),
            expect=(("all_reduce", 4 * 2 * BATCH * D_MODEL),),  # x @ w1 @ w2 and x's gradient
        ),
        Case(
            "ffn-2d",
            "FFN fwd+bwd",
            "2D: x P(,tp2) w1 P(tp2,tp1) w2 P(tp1,tp2)",
            (2, 2),
            ("tp1", "tp2"),
            _ffn((P(None, "tp2"), P("tp2", "tp1"), P("tp1", "tp2"))),
            expect=(("all_reduce", 4 * BATCH * (D_FF // 2 + D_MODEL // 2)),),  # the forward
        ),
        Case(
            "gpt-dp-tp",
            "tiny GPT AdamW step",
            "dp x tp: tokens P(dp), Megatron qkv/proj/fc/out",
            (2, 2),
            ("dp", "tp"),
            _gpt,
            expect=(("all_reduce", 1),),
        ),
    )
}

# ---- one collective, either side ------------------------------------------------------------


@dataclass(frozen=True)
class Collective:
    kind: str  # all_reduce, all_gather, reduce_scatter, all_to_all, collective_permute
    group_size: int
    buffer_bytes: int  # N of the ring closed form (see the module docstring)
    bytes_per_device: int  # what each device sends
    shape: str  # the result type
    where: str  # XLA: the op_name metadata; ipujax: axes, why, source


def _abstract(args: Any) -> Any:
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype), args)


# ---- XLA side (runs in the child process) ---------------------------------------------------

_OPCODES = {
    "kAllReduce": "all_reduce",
    "kAllReduceStart": "all_reduce",
    "kAllGather": "all_gather",
    "kAllGatherStart": "all_gather",
    "kReduceScatter": "reduce_scatter",
    "kAllToAll": "all_to_all",
    "kCollectivePermute": "collective_permute",
    "kCollectivePermuteStart": "collective_permute",
}
_INSTRUCTION = re.compile(
    r"=\s*(?P<shape>.*?)\s+(?P<op>all-reduce|all-gather|reduce-scatter|all-to-all|"
    r"collective-permute)(?P<start>-start)?\("
)
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")


def _array_bytes(shape: str) -> list[int]:
    """Bytes of each array in an HLO shape (one, or the elements of a tuple)."""
    sizes = []
    for dtype, dims in _ARRAY.findall(shape):
        bits = 8 if dtype == "pred" else int(re.search(r"\d+", dtype).group())  # type: ignore[union-attr]
        count = math.prod(int(d) for d in dims.split(",") if d)
        sizes.append(count * bits // 8)
    return sizes


def _group_size(text: str, partitions: int) -> int:
    """The size of one replica group of a collective instruction's text."""
    if "source_target_pairs=" in text:
        return 2  # a collective-permute: each source sends to one target
    groups = re.search(
        r"replica_groups=(\{\}|\{\{[0-9,{}]*\}\}|\[[^\]]*\]<=|mesh\[[^{]*\{[^}]*\})", text
    )
    if groups is None:
        return partitions
    spec = groups.group(1)
    if spec == "{}":  # one group of every partition
        return partitions
    if spec.startswith("{{"):  # explicit: {{0,2},{1,3}}
        return len(spec[2:].split("}")[0].split(","))
    if spec.startswith("["):  # iota: [groups,size]<=[...]
        return int(spec[1:-3].split(",")[-1])
    # named mesh: mesh['a'=2,'b'=2](, device_ids=(...)) {'b'}; a sub-axis reads {'b':(1)2}
    sizes = {name: int(size) for name, size in re.findall(r"'(\w+)'=(\d+)", spec)}
    size = 1
    for name, sub in re.findall(r"'(\w+)'(?::\(\d+\)(\d+))?", spec[spec.rindex("{") :]):
        size *= int(sub) if sub else sizes[name]
    return size


def _xla_collective(text: str, kind: str, partitions: int) -> Collective:
    match = _INSTRUCTION.search(text)
    if match is None:
        raise ValueError(f"cannot read the result shape of {text}")
    shape, started = match.group("shape"), bool(match.group("start"))
    arrays = _array_bytes(shape)
    if started and kind == "all_gather":  # (operands..., results...)
        arrays = arrays[len(arrays) // 2 :]
    elif started and kind == "collective_permute":  # (operand, result, u32[], u32[])
        arrays = arrays[:1]
    n = _group_size(text, partitions)
    if kind == "reduce_scatter":  # the result is one shard of the input
        arrays = [a * n for a in arrays]
    if kind == "collective_permute":
        sent = sum(arrays)
    else:  # a combined (tuple) collective: its element buffers, each by the closed form
        sent = sum(ring_bytes(kind, a, n)[0] for a in arrays)
    name = re.search(r'op_name="([^"]*)"', text)
    shape = re.sub(r"\{[0-9,]*\}|/\*index=\d+\*/", "", shape)  # drop layouts and index notes
    return Collective(kind, n, sum(arrays), sent, shape, name.group(1) if name else "")


def hlo_collectives(compiled: Any, partitions: int) -> list[Collective]:
    """Every collective instruction of a compiled jax executable's partitioned HLO modules."""
    found = []
    for module in compiled.runtime_executable().hlo_modules():
        for computation in module.computations():
            for instruction in computation.instructions():
                kind = _OPCODES.get(str(instruction.opcode).rsplit(".", 1)[-1])
                if kind is not None:
                    found.append(_xla_collective(instruction.to_string(), kind, partitions))
    return found


def xla_side(case: Case) -> list[Collective]:
    """Compiles the case with jax.jit over NamedShardings; needs `case`'s device count."""
    from jax.sharding import Mesh, NamedSharding

    fun, args, in_specs, out_specs = case.build()
    n = math.prod(case.mesh_shape)
    devices = jax.devices()
    if len(devices) < n:
        raise RuntimeError(f"{case.name} needs {n} devices, jax has {len(devices)}")
    mesh = Mesh(np.asarray(devices[:n]).reshape(case.mesh_shape), case.axis_names)

    def shardings(tree: Any) -> Any:
        return jax.tree.map(
            lambda s: NamedSharding(mesh, s), tree, is_leaf=lambda s: isinstance(s, P)
        )

    jitted = jax.jit(fun, in_shardings=shardings(in_specs), out_shardings=shardings(out_specs))
    compiled = jitted.lower(*_abstract(args)).compile()
    return hlo_collectives(compiled, n)


def _child(names: Sequence[str]) -> None:
    result = {name: [asdict(c) for c in xla_side(CASES[name])] for name in names}
    print(json.dumps(result))


def run_json_child(
    argv: Sequence[str], devices: int | None, what: str, timeout: float = 900
) -> Any:
    """Runs `python argv...` in the environment of `child_env(devices)` and returns the JSON
    its last line prints; a failed child raises with the end of its stderr."""
    proc = subprocess.run(
        [sys.executable, *argv],
        env=child_env(devices),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the {what} child failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def child_env(devices: int | None = None) -> dict[str, str]:
    """The environment of a child Python process: CPU jax, the repository and its examples on
    the path and, with `devices`, that many forced host devices (an XLA flag that only takes
    effect if it is set before jax is imported, hence a child process)."""
    env = dict(os.environ)
    if devices is not None:
        flag = f"--xla_force_host_platform_device_count={devices}"
        kept = re.sub(r"--xla_force_host_platform_device_count=\S*", "", env.get("XLA_FLAGS", ""))
        env["XLA_FLAGS"] = f"{kept} {flag}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), str(REPO / "examples"), env.get("PYTHONPATH", "")) if p
    )
    return env


def xla_collectives(names: Iterable[str]) -> dict[str, list[Collective]]:
    """Runs the XLA side of the named cases in one child process with forced host devices."""
    names = list(names)
    data = run_json_child([str(Path(__file__).resolve()), "--xla-child", *names], DEVICES, "XLA")
    return {name: [Collective(**c) for c in data[name]] for name in names}


# ---- ipujax side ----------------------------------------------------------------------------


def ipujax_side(case: Case) -> list[Collective]:
    import ipujax

    fun, args, in_specs, out_specs = case.build()
    mesh = ipujax.make_mesh(
        case.mesh_shape, case.axis_names, target=ipujax.Target.bow().with_tiles(TILES)
    )
    jitted = ipujax.jit(fun, mesh=mesh, in_shardings=in_specs, out_shardings=out_specs)
    return ipujax_collectives(jitted.lower(*_abstract(args)).compile())


def ipujax_collectives(compiled: Any) -> list[Collective]:
    """The collectives of a compiled ipujax program (`cost_report().collectives`), each with its
    ring buffer N and result type when the per-IPU program's collective ops line up with the
    report's, else N recovered from the report's bytes."""
    collectives = compiled.cost_report().collectives
    ops = _ipujax_ops(compiled)
    matched = len(ops) == len(collectives) and all(
        kind == c.kind and ring_bytes(kind, buffer, c.group_size)[0] == c.bytes_per_ipu
        for (kind, _, buffer), c in zip(ops, collectives, strict=False)
    )
    if not matched:
        ops = [
            (c.kind, "", _ring_buffer(c.kind, c.bytes_per_ipu, c.group_size)) for c in collectives
        ]
    return [
        Collective(
            kind=c.kind,
            group_size=c.group_size,
            buffer_bytes=buffer,
            bytes_per_device=c.bytes_per_ipu,
            shape=shape,
            where=f"over {','.join(c.axes)}: {c.why}".replace(f"{REPO}{os.sep}", ""),
        )
        for c, (_, shape, buffer) in zip(collectives, ops, strict=True)
    ]


def _ipujax_ops(compiled: Any) -> list[tuple[str, str, int]]:
    """(kind, result type, ring buffer N) of the per-IPU program's collectives in program order,
    as `partitioner.tiles.rules` costs them (best effort: the report does not carry shapes)."""
    from lowering import COLLECTIVES

    partitioned = getattr(compiled, "partitioned", None)
    if partitioned is None:
        return []
    return [
        (
            op.name,
            op.results[0].type_str,
            op.results[0].nbytes if op.name == "all_gather" else op.operands[0].nbytes,
        )
        for op in partitioned.graph.ops
        if op.name in COLLECTIVES
    ]


def _ring_buffer(kind: str, sent: int, n: int) -> int:
    """N back from a ring's bytes per device (to print; the comparison uses `sent`)."""
    if n <= 1:
        return 0
    return round(sent * n / ((2 if kind == "all_reduce" else 1) * (n - 1)))


# ---- the comparison -------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    collectives: tuple[Collective, ...]

    @property
    def bytes(self) -> int:
        return sum(c.bytes_per_device for c in self.collectives)

    @property
    def counts(self) -> dict[str, int]:
        return dict(sorted(Counter(c.kind for c in self.collectives).items()))

    @property
    def bytes_by_kind(self) -> dict[str, int]:
        totals: Counter[str] = Counter()
        for c in self.collectives:
            totals[c.kind] += c.bytes_per_device
        return dict(sorted(totals.items()))

    def buffer_bytes(self, kind: str) -> int:
        return sum(c.buffer_bytes for c in self.collectives if c.kind == kind)

    def counts_text(self) -> str:
        return " ".join(f"{k}:{v}" for k, v in self.counts.items()) or "-"


@dataclass(frozen=True)
class Row:
    case: Case
    xla: Side
    ipujax: Side
    seconds: float  # ipujax compile time

    @property
    def ratio(self) -> float:
        return self.ipujax.bytes / self.xla.bytes if self.xla.bytes else math.inf

    @property
    def ours_no_more(self) -> bool:
        return self.ipujax.bytes <= self.xla.bytes


def compare_all(names: Iterable[str] | None = None) -> list[Row]:
    """Every named case (all by default): the XLA side in one child process, then ipujax's."""
    names = list(CASES if names is None else names)
    xla = xla_collectives(names)
    rows = []
    for name in names:
        start = time.perf_counter()
        ours = ipujax_side(CASES[name])
        seconds = time.perf_counter() - start
        rows.append(Row(CASES[name], Side(tuple(xla[name])), Side(tuple(ours)), seconds))
    return rows


def compare(name: str) -> Row:
    (row,) = compare_all([name])
    return row


def table(rows: Sequence[Row]) -> str:
    header = (
        "program",
        "strategy",
        "mesh",
        "XLA collectives",
        "XLA B/dev",
        "ipujax collectives",
        "ipujax B/IPU",
        "ratio",
        "ours<=XLA",
    )
    body = [
        (
            r.case.program,
            r.case.strategy,
            r.case.mesh,
            r.xla.counts_text(),
            f"{r.xla.bytes:,}",
            r.ipujax.counts_text(),
            f"{r.ipujax.bytes:,}",
            f"{r.ratio:.2f}",
            "yes" if r.ours_no_more else "NO",
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in (header, *body)) for i in range(len(header))]
    lines = [
        " | ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True))
        for line in (header, *body)
    ]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def details(row: Row) -> str:
    """Every collective of both sides of one case."""
    lines = [f"{row.case.name} ({row.case.program}, {row.case.strategy}, {row.case.mesh}):"]
    for label, side in (("XLA", row.xla), ("ipujax", row.ipujax)):
        kinds = ", ".join(f"{k} {v:,}" for k, v in side.bytes_by_kind.items())
        lines.append(f"  {label}: {side.bytes:,} bytes per device ({kinds})")
        for c in side.collectives:
            lines.append(
                f"    {c.kind:<18} n={c.group_size} {c.shape:<28} N={c.buffer_bytes:>7,} "
                f"sent={c.bytes_per_device:>7,}  {c.where}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cases", nargs="*", help=f"cases to run (default all: {', '.join(CASES)})")
    parser.add_argument("-v", "--verbose", action="store_true", help="list every collective")
    parser.add_argument("--xla-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [n for n in args.cases if n not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {list(CASES)}")
    if args.xla_child:
        _child(args.cases)
        return 0
    start = time.perf_counter()
    rows = compare_all(args.cases or None)
    print(table(rows))
    for row in rows:
        if args.verbose or not row.ours_no_more:
            print()
            print(details(row))
    print(f"\n{time.perf_counter() - start:.1f} s")
    return 0 if all(r.ours_no_more for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

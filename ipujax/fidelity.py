"""Published figures, and what ipujax's cost model says of the same programs (docs/fidelity.md).

Each `Figure` names a measurement Graphcore or others published, its source, and a function that
compiles the same program for the same virtual machine and reads the same quantity from its
cost report: cycles of a compute set, of a layer's steps, a rate, or a ratio of two step times.
`ipujax fidelity` prints the table; `make bench` and docs/fidelity.md keep the latest.

A figure is checked, never fitted: no constant of the `Target` was chosen to match one of these.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from ipujax.api import jit
from ipujax.errors import HostBoundWarning
from ipujax.fidelity_inference import INFERENCE_FIGURES
from ipujax.fidelity_memory import MEMORY_FIGURES
from ipujax.fidelity_ranking import ranking_summary
from ipujax.fidelity_systems import (
    BOW_RESNET_MICRO_BATCH,
    bert_base_figure,
    bert_large_figure,
    resnet50_figure,
)
from ipujax.report import CostReport
from partitioner import Target, make_mesh

LOW, HIGH = 0.75, 1.33  # the band every figure must fall in (issue 17)

# The kinds of figure the summary gives its error for, as Calculon reports its validation.
OPS = "single ops, layers and rates"
SYSTEMS = "whole systems"
MEMORY = "memory"
KINDS = (OPS, SYSTEMS, MEMORY)


@dataclass(frozen=True, slots=True)
class Figure:
    """A published measurement and how to read the same quantity from ipujax."""

    name: str
    published: float
    unit: str
    source: str
    # The figure, or the figure and how ipujax derived it (a line for docs/fidelity.md).
    measure: Callable[[], float | tuple[float, str]]
    what: str  # the quantity ipujax reads, in a few words
    # A whole system's throughput depends on more than the cost model (how Graphcore's
    # software overlapped and combined its work), so its issue set a wider band.
    band: tuple[float, float] = (LOW, HIGH)
    kind: str = OPS  # one of KINDS
    ipus: int = 1  # the system the figure was measured on


# A whole system's throughput depends on more than the cost model (how Graphcore's software
# overlapped and combined its work), so its issue set a wider band.
WHOLE_SYSTEM: dict[str, Any] = {"band": (0.5, 1.5), "kind": SYSTEMS}


@dataclass(frozen=True, slots=True)
class Row:
    figure: Figure
    ipujax: float
    derivation: str = ""

    @property
    def ratio(self) -> float:
        return self.ipujax / self.figure.published

    @property
    def within(self) -> bool:
        low, high = self.figure.band
        return low <= self.ratio <= high

    @property
    def error(self) -> float:
        """|ipujax / published - 1|: the relative error of the prediction."""
        return abs(self.ratio - 1)


def _mean_max(rows: Sequence[Row]) -> str:
    errors = [row.error for row in rows]
    mean = sum(errors) / len(errors)
    return f"mean {mean:.1%}, max {max(errors):.1%} over {len(errors)} rows"


def error_summary(rows: Sequence[Row]) -> str:
    """The mean and maximum |error| over the rows, then per kind of figure: the line
    `ipujax fidelity` ends with and docs/fidelity.md gives under its table."""
    if not rows:
        return "|error|: no rows"
    kinds = [
        f"{kind}: {_mean_max(of)}"
        for kind in KINDS
        if (of := [row for row in rows if row.figure.kind == kind])
    ]
    return "; ".join([f"|error| {_mean_max(rows)}", *kinds])


def _report(
    fun: Callable, args: Sequence, target: Target, ipus: int = 1, shardings: Any = None
) -> CostReport:
    mesh = make_mesh((ipus,), ("ipus",), target=target)
    lowered = jit(fun, mesh=mesh, in_shardings=shardings).lower(*args)
    with warnings.catch_warnings():
        # A kernel measured alone is host-bound; its figures read the device's cycles.
        warnings.simplefilter("ignore", HostBoundWarning)
        return lowered.compile(check_memory_fits=False).cost_report()


def _spec(shape: tuple[int, ...], dtype: jnp.dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def _matmul_compute(report: CostReport) -> int:
    """The compute set of the program's matmul vertices (`dot_general.matmul`)."""
    (step,) = [s for s in report.supersteps if s.name.endswith("dot_general.matmul")]
    return step.compute_cycles


@functools.cache
def _amp_cycles(rows: int) -> int:
    """One [rows, 16] x [16, 16] fp16 matmul on each of a Bow's 1,472 tiles: a batched matmul
    whose batch the planner spreads one group per tile (compiled once per size: the rate
    figure reads the 2,048-row case again)."""
    tiles = Target.bow().tiles_per_ipu
    a, b = _spec((tiles, rows, 16), jnp.float16), _spec((tiles, 16, 16), jnp.float16)
    return _matmul_compute(_report(jnp.matmul, (a, b), Target.bow()))


def _amp_per_tile(rows: int) -> Callable[[], float]:
    return lambda: _amp_cycles(rows)


def _amp_tflops() -> float:
    """The rate of the 2,048-row case over the whole chip, in TFLOPS."""
    bow = Target.bow()
    cycles = _amp_cycles(2048)
    return 2 * 2048 * 16 * 16 * bow.tiles_per_ipu * bow.clock_hz / cycles / 1e12


def _attention_scores() -> float:
    """Q . K^T of a ViT-H/14 attention layer, 16 heads of 729 x 72, fp16, on one Bow IPU."""
    q = k = _spec((16, 729, 72), jnp.float16)
    scores = _report(lambda q, k: jnp.einsum("hqd,hkd->hqk", q, k), (q, k), Target.bow())
    return _matmul_compute(scores)


def _dense_layer() -> float:
    """Keras `Dense(1024)` on a batch of 16 x 4,096 float32 inputs, on one MK2 IPU: every step
    of the layer (the matmul, the reduction of its partials, the bias), each as long as its
    busiest tile, exchanges included."""
    x = _spec((16, 4096), jnp.float32)
    w, b = _spec((4096, 1024), jnp.float32), _spec((1024,), jnp.float32)
    report = _report(lambda x, w, b: x @ w + b, (x, w, b), Target.mk2())
    return sum(s.cycles for s in report.supersteps if s.kind not in ("host",))


def _bow_over_mk2() -> float:
    """Two transformer layers (d 1,024, 16 heads, 512 tokens, fp16) over an embedding of 8,192
    tokens, trained by SGD, data parallel over a 4-IPU machine, 2 sequences per IPU (the batch
    that fits without recomputation): seconds per step on an MK2 over seconds on a Bow. The
    IPU-Links, the host and the syncs' latencies do not speed up with the clock; Graphcore's
    runs amortise the gradients' AllReduce over many accumulated micro-batches, so their ratio
    sits nearer the clocks' 1.40 than one step's does."""

    def step(params: dict, tokens: jax.Array) -> tuple:
        def loss(p: dict) -> jax.Array:
            h = _layer(p, _layer(p, p["embed"][tokens]))
            return jnp.mean(h.astype(jnp.float32) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), value

    d, f = 1024, 4096
    params = {
        "embed": _spec((8192, d), jnp.float16),
        "qkv": _spec((d, 3 * d), jnp.float16),
        "out": _spec((d, d), jnp.float16),
        "up": _spec((d, f), jnp.float16),
        "down": _spec((f, d), jnp.float16),
    }
    tokens = _spec((8, 512), jnp.int32)
    shardings = (PartitionSpec(), PartitionSpec("ipus"))
    mk2 = _report(step, (params, tokens), Target.mk2(), 4, shardings).seconds
    bow = _report(step, (params, tokens), Target.bow(), 4, shardings).seconds
    return mk2 / bow


def _layer(p: dict, x: jax.Array, heads: int = 16) -> jax.Array:
    batch, seq, d = x.shape
    q, k, v = jnp.split(x @ p["qkv"], 3, axis=-1)
    split = lambda t: t.reshape(batch, seq, heads, d // heads).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(d // heads)
    att = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)
    h = x + att.transpose(0, 2, 1, 3).reshape(batch, seq, d) @ p["out"]
    return h + jax.nn.gelu(h @ p["up"]) @ p["down"]


_TESSELLATE = (
    "graphcore-research/tessellate-ipu, notebooks/IPU Peak Flops.ipynb: one "
    "ConvPartial1x1Out vertex per tile on a Bow, cycles = 2 N 256 x 1,472 x 1.85 GHz / TFLOPS"
)

FIGURES: tuple[Figure, ...] = (
    *(
        Figure(
            f"AMP vertex, fp16 [{n}, 16] x [16, 16] per tile, Bow",
            published,
            "cycles",
            _TESSELLATE,
            _amp_per_tile(n),
            "compute set of the matmul",
        )
        for n, published in ((16, 402), (64, 584), (96, 716), (2048, 8525))
    ),
    Figure(
        "Large fp16 matmul rate, 2,048 rows per tile, Bow",
        334.9,
        "TFLOPS",
        _TESSELLATE + " (96.1% of the 348.6 TFLOPS peak)",
        _amp_tflops,
        "FLOPs over the matmul's compute set",
    ),
    Figure(
        "ViT attention Q.K^T, fp16 [16, 729, 72] x [72, 729], Bow",
        8488,
        "cycles",
        "PopVision profile of a ViT training step on one Bow IPU, quoted in ipujax issue 17 "
        "(PopLibs' compute set; the ideal is 6,499)",
        _attention_scores,
        "compute set of the matmul",
    ),
    Figure(
        "Keras Dense 4,096 -> 1,024, fp32, batch 16, MK2",
        8700,
        "cycles",
        "graphcore/ipu_tensorflow_addons, keras/experimental/auto_pipeline/utils/"
        "pva_utils_test.py (Model1Dense, Poplar 3.0.0: the layer's program steps, the busiest "
        "tile of each)",
        _dense_layer,
        "the layer's supersteps",
    ),
    Figure(
        "Bow over MK2 training throughput (Conformer)",
        1.36,
        "x",
        "Graphcore's Bow launch (March 2022), Conformer training 1.35-1.37x an IPU-M2000 "
        "(as quoted in ipujax issue 17); the Bow Pod64 datasheet "
        "(docs.graphcore.ai/projects/bow-pod64-datasheet, overview) says 'up to 40%'",
        _bow_over_mk2,
        "a 2-layer transformer's training step, data parallel on 4 IPUs",
        ipus=4,
    ),
    Figure(
        "ResNet-50 training throughput, fp16, MK2 Pod16 (16 replicas)",
        26000,
        "images/s",
        "Graphcore, 'Scaling computer vision training on the IPU' (Lakshmi Krishnan's talk): "
        "'about 26,000 images per second' on a Pod16 with TensorFlow; the configuration is "
        "that of graphcore/examples vision/cnns/pytorch configs.yml resnet50_mk2: 18 images "
        "per replica, 16 replicas, batch norm, 16.16, gradient accumulation 57, 8-bit IO, "
        "its recomputation checkpoints and available memory proportion 0.16",
        resnet50_figure(Target.mk2(), 16, "resnet50_mk2"),
        "a loop over 57 micro-batches, then one gradient AllReduce, data parallel on 16 IPUs",
        **WHOLE_SYSTEM,
        ipus=16,
    ),
    *(
        Figure(
            f"ResNet-50 training throughput, fp16, Bow {pod} ({ipus} replicas)",
            published,
            "images/s",
            "graphcore.ai performance results (pre-SDK 2.5 table, as mirrored at "
            f"graphcore.cn/performance-results): ResNet-50 v1.5, Bow {pod}, TensorFlow 1, "
            f"ImageNet, 16.16, batch {batch:,}, {published:,} images/s; the batch is {ipus} "
            f"replicas x {BOW_RESNET_MICRO_BATCH} images x {micro_batches} accumulated "
            "micro-batches (graphcore/examples vision/cnns tensorflow1 configs.yml "
            "resnet50_mlperf_pod16_bs20 and _pod64_bs20, with their recomputation checkpoints "
            "(the configs' splits) and available memory proportions 0.15 and 0.145)",
            resnet50_figure(Target.bow(), ipus, "resnet50_bow"),
            f"a loop over {micro_batches} micro-batches, then one gradient AllReduce, "
            f"data parallel on {ipus} IPUs",
            **WHOLE_SYSTEM,
            ipus=ipus,
        )
        for pod, ipus, batch, published in (
            ("Pod16", 16, 1920, 42029),
            ("Pod64", 64, 2560, 145287),
            ("Pod256", 256, 10240, 425514),
        )
        for micro_batches in (batch // (ipus * BOW_RESNET_MICRO_BATCH),)
    ),
    Figure(
        "BERT-Large pretraining phase 1 (seq 128), Bow Pod16, 4 replicas x 4 pipeline stages",
        5179,
        "sequences/s",
        "graphcore.ai performance results (pre-SDK 2.5 table, as mirrored at "
        "graphcore.cn/performance-results): BERT Large Ph1 Pre-Training, Bow Pod16, PopART, "
        "16.16, global batch 65,536, 5,179 sequences/s; the configuration is graphcore/examples "
        "popart bert configs/mk2/pretrain_large_128.json: micro-batch 8, 4 replicas, 4 IPUs per "
        "replica, gradient accumulation 2,048, LAMB, optimizer state off chip, recomputation",
        bert_large_figure(4, 2048),
        "a micro-batch's program in 4 stages, pipelined over 2,048 micro-batches",
        **WHOLE_SYSTEM,
        ipus=16,
    ),
    Figure(
        "BERT-Large pretraining phase 1 (seq 128), Bow Pod64, 16 replicas x 4 pipeline stages",
        19353,
        "sequences/s",
        "the same table: Bow Pod64, PopART, 19,353 sequences/s; graphcore/examples "
        "pretrain_large_128_POD64: 16 replicas, gradient accumulation 512",
        bert_large_figure(16, 512),
        "a micro-batch's program in 4 stages, pipelined over 512 micro-batches",
        **WHOLE_SYSTEM,
        ipus=64,
    ),
    Figure(
        "BERT-Base pretraining phase 1 (seq 128), Bow Pod16, 4 replicas x 4 pipeline stages",
        16391,
        "sequences/s",
        "graphcore.ai performance results (SDK 3.1 table, as mirrored at "
        "graphcore.cn/performance-results): BERT Base Ph1 Pre-Training (SL128), Bow Pod16, "
        "PopART, 16.16, batch 65,536, 16,391 sequences/s; the configuration is graphcore/examples "
        "popart bert configs/pretrain_base_128.json: micro-batch 32, 4 replicas, 4 IPUs per "
        "replica (the embedding, then 4 layers on each of 3), gradient accumulation 512, LAMB, "
        "optimizer state off chip, recomputation",
        bert_base_figure(4, 512),
        "a micro-batch's program in 4 stages, pipelined over 512 micro-batches",
        **WHOLE_SYSTEM,
        ipus=16,
    ),
    *(
        Figure(i.name, i.published, i.unit, i.source, i.measure, i.what, kind=SYSTEMS)
        for i in INFERENCE_FIGURES
    ),
    *(
        Figure(m.name, m.published, m.unit, m.source, m.measure, m.what, kind=MEMORY)
        for m in MEMORY_FIGURES
    ),
)


def run(figures: Sequence[Figure] = FIGURES) -> list[Row]:
    rows = []
    for figure in figures:
        measured = figure.measure()
        value, derivation = measured if isinstance(measured, tuple) else (measured, "")
        rows.append(Row(figure, float(value), derivation))
    return rows


def number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.2f}"


def ratio_text(row: Row) -> str:
    """The ratio, with the row's band when it is not the table's."""
    if row.figure.band == (LOW, HIGH):
        return f"{row.ratio:.2f}"
    low, high = row.figure.band
    return f"{row.ratio:.2f} (band {low}-{high})"


def markdown(rows: Sequence[Row]) -> str:
    """The table as docs/fidelity.md holds it."""
    lines = [
        "| figure | published | ipujax | ratio | ipujax reads | source |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        f = row.figure
        lines.append(
            f"| {f.name} | {number(f.published)} {f.unit} | {number(row.ipujax)} {f.unit} | "
            f"{ratio_text(row)} | {f.what} | {f.source} |"
        )
    return "\n".join(lines)


def document(rows: Sequence[Row]) -> str:
    """docs/fidelity.md: the table between the notes that say how to read it, and how the
    figures that need one were derived."""
    derived = [f"- **{r.figure.name}**: {r.derivation}" for r in rows if r.derivation]
    derivations = "\n## Derivations\n\n" + "\n".join(derived) + "\n" if derived else ""
    summary = f"\nOver the table, {error_summary(rows)}.\n\n{ranking_summary(rows)}.\n"
    return _HEADER + markdown(rows) + "\n" + summary + derivations + _FOOTER


_HEADER = f"""# Fidelity: ipujax against published figures

Written by `ipujax fidelity --markdown docs/fidelity.md` (and `make bench`); do not edit the
table by hand. Each row compiles the program behind a published IPU measurement for the same
virtual machine and reads the same quantity from its cost report. The band is
{LOW}-{HIGH}x unless a row gives its own (a whole system's throughput, whose issue set
0.5-1.5x); `ipujax fidelity` exits with 1 when a ratio falls outside its band. No constant of the
`Target` was fitted to a row: each cost term comes from PopLibs' estimators or a stated source
(docs/target.md), and the rows check it.

"""

_FOOTER = """
## Figures not in the table yet

- The strided copy of 126,283 cycles next to the Q.K^T above, in the same ViT profile: the
  profile does not give the copy's shape or strides, so its program cannot be rebuilt. The copy
  rates it would run at are in docs/target.md ("On-tile copies").
- Graphcore's MLPerf v1.1 ResNet-50, 30,000 images/s on an MK2 Pod16 (with distributed batch
  norm, LARS and other optimisations described in Graphcore's "Accelerating ResNet-50 training
  on the IPU for MLPerf", January 2022): its configuration differs from the example's.
- The Bow ResNet-50 rows across Pod sizes: Graphcore's throughput per IPU falls 14% from a
  Pod16 to a Pod64 and 37% to a Pod256; ipujax's falls 15% and 16%. One micro-batch's step
  (8.4-8.8 ms for 20 images with elementwise chains fused, reshapes read through,
  reductions' epilogues joined, sibling reductions run together, a normalisation's [C]
  vectors in one chain, reductions where their operands lie and later micro-batches' images
  fetched during the one before) is above the
  about 7 ms that fitting step = micro-batches x micro-batch + AllReduce to the three
  published figures implies; its convolutions' exchange (about 2 ms) is most of the rest. The
  Pod256 reads high because its gradients' AllReduce runs level by level across the Pod64s
  (docs/target.md, "IPU-Links and systems") in 3.4 ms, where the fit implies about 10 ms;
  what else a Pod256 pays (the host's feeding of 425,000 images a second over 64 hosts, the
  Gateway-Links' latency) is not modelled.
- The ResNet-50 rows run Graphcore's own memory settings: each config's recomputation
  checkpoints (`examples/resnet/workloads.py`, `PYTORCH_CHECKPOINTS` and `TF1_CHECKPOINTS`)
  and its `available_memory_proportion` (0.16 on the MK2, 0.15 and 0.145 on the Bow Pods).
  With every block recomputed from its input and the default proportion (0.6), the Bow step
  did not fit (723,848 B on its fullest tile: the stem's three 21.8 KB tensors and 16 block
  checkpoints kept, with 175 KB of a 1x1 convolution's operand blocks and partials on top);
  with the config's settings it fits, at 584,322 B (Pod16) and 583,662 B (Pod64, Pod256).
  Both configs also ask for half-precision partials (`enable_half_partials`, `half_partial`),
  which ipujax does not model: its partials stay f32, so its matmul temporaries are if
  anything larger than Poplar's.
- Graphcore's packed BERT-Large figures (PopART 6,044 and PyTorch 5,592 sequences/s on a Bow
  Pod16, 22,759 and 18,494 on a Bow Pod64, SDK 3.1) count the sequences in packs of up to 3 per
  128 tokens (packing factor about 1.17); the rows above are the unpacked runs.
- GPT throughput on Pods: Graphcore published no GPT-3 175B throughput for its PopXL example,
  so there is no figure to check; `ipujax plan` ranks the ways to run it (docs/plan.md).
- The memory of the same TensorFlow MLP's SGD step at batch 1, 7,738,391 B
  (`matmul_size_test.py:159`): ipujax holds 20.6 MB (2.66x). Its peak is the first layer's
  weight gradient, a [50,176, 1] x [1, 32] outer product whose f32 partial sums ipujax charges
  at twice the f16 output on every tile; and the step's code alone (7.3 MB by ipujax's
  categories) is as large as the published total, which an IPU Model without compiled IPU
  code may not size as a hardware compile does (docs/target.md, "Checked against measured
  profiles").
- Graphcore's other TensorFlow memory assertions (`functional_ops_test.py`,
  `matmul_graph_caching_test.py` and others) set no tile count, so they ran on the test
  suite's IPU Model: their totals are about 8 times their fullest tile (13.8 MB and 1.7 MB in
  `matmul_graph_caching_test.py:67-68`), a few tiles rather than a whole IPU.
"""

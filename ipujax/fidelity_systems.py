"""The fidelity table's whole systems (`ipujax.fidelity.FIGURES`): ResNet-50, BERT-Large and
BERT-Base as Graphcore trained them, each step compiled from the project's examples with its
accumulation (cost only), and the figure read from its report, with a derivation a reader can
check.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from ipujax.api import jit
from ipujax.planning import samples_per_step
from ipujax.report import CostReport
from partitioner import Target, make_mesh

_EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def example(path: str) -> ModuleType:
    """A module of the project's examples, loaded by path (a source checkout has them)."""
    file = _EXAMPLES / path
    if not file.exists():
        raise FileNotFoundError(f"{file} not found: this figure needs the project's examples")
    name = "ipujax_fidelity_" + path.replace("/", "_").removesuffix(".py")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# Graphcore's ResNet-50 configs, as examples/resnet/workloads.py records them (`GraphcoreRun`):
# PyTorch resnet50_mk2 on an MK2 Pod16; TensorFlow 1 resnet50_mlperf_pod16_bs20 and _pod64_bs20
# behind the Bow figures: 20 images per replica and micro-batch, batches of 1,920 on a Pod16,
# 2,560 on a Pod64 and 10,240 on a Pod256 (the Pod64 config on 256 replicas).
BOW_RESNET_MICRO_BATCH = 20


def resnet50_figure(target: Target, replicas: int, factory: str) -> Callable[[], tuple[float, str]]:
    """ResNet-50 training, data parallel over `replicas` IPUs as Graphcore's configs ran it
    (the workload `factory`: `resnet50_mk2` or `resnet50_bow`): its micro-batch of images per
    replica, batch norm over each replica's own batch, fp16, SGD with momentum, 8-bit images,
    recomputation from the config's checkpoints, its available memory proportion, and its
    micro-batches' gradients summed per update.
    The whole step is compiled (cost only): a loop over the micro-batches, each IPU's
    gradients carried as partial sums and reduced once after it, then the update; images per
    second = accumulation x micro-batch x replicas / the step's seconds."""

    def figure() -> tuple[float, str]:
        workloads = example("resnet/workloads.py")
        data_parallel = workloads.sharding.KNOWN_AXES[0]  # the axis the example splits over
        mesh = make_mesh((replicas,), (data_parallel,), target=target)
        fun, args, kwargs = getattr(workloads, factory)(mesh)
        compiled = jit(fun, **kwargs).lower(*args).compile(check_memory_fits=False)
        report = compiled.cost_report()
        # images [accumulation, batch, H, W, C], or [batch, H, W, C] without accumulation
        *lead, micro_batch = args[3].shape[:-3]
        accumulation = lead[0] if lead else 1
        images = accumulation * micro_batch  # over the replicas: the global batch
        proportion = kwargs["mesh"].target.available_memory_proportion
        per_replica = micro_batch // replicas
        derivation = _resnet_derivation(report, factory, accumulation, per_replica, proportion)
        return images / report.seconds, derivation

    return figure


def _resnet_derivation(
    report: CostReport, factory: str, accumulation: int, micro_batch: int, proportion: float
) -> str:
    split = report.time_split()
    images = accumulation * micro_batch * report.ipus
    per_micro = {
        name: split[name] / accumulation * 1e3
        for name in ("compute", "copies", "exchange", "sync", "host")
    }
    parts = ", ".join(f"{name} {ms:.2f}" for name, ms in per_micro.items())
    (route,) = {c.why.rsplit("; over ", 1)[-1] for c in report.collectives} or {"no links"}
    return (
        f"the step is a loop over {accumulation} micro-batches of {micro_batch} images per IPU, "
        f"recomputed from the config's checkpoints, matmuls planned within "
        f"{proportion:g} of a tile, "
        f"{sum(per_micro.values()):.2f} ms each on average ({parts}, the host IO that of the "
        f"8-bit images), then the gradients' AllReduce {split['collectives'] * 1e3:.2f} ms once, "
        f"after the loop, over {route}, and the update; peak tile memory "
        f"{report.peak_tile_bytes:,} of {report.bytes_per_tile:,} B (fits: "
        f"{'yes' if report.fits else 'no'}). {images:,} images / {report.seconds * 1e3:.1f} ms "
        f"= {images / report.seconds:,.0f} images/s. `ipujax cost-report "
        f"examples/resnet/workloads.py:{factory} --mesh dp={report.ipus} --target "
        f"{report.target}` shows it."
    )


def bert_large_figure(replicas: int, microbatches: int) -> Callable[[], tuple[float, str]]:
    """BERT-Large pretraining phase 1 pipelined as Graphcore ran it: 4 IPUs per replica (the
    24 layers in 4 stages by the cost of their blocks), micro-batches of 8 sequences of 128
    tokens, `microbatches` of them accumulated per update, recomputation, fp16, LAMB with its
    state off chip. Sequences per second = the step's sequences / the step's seconds."""
    return _bert_figure("bert_large", replicas, microbatches)


def bert_base_figure(replicas: int, microbatches: int) -> Callable[[], tuple[float, str]]:
    """BERT-Base pretraining phase 1 as `bert_large_figure`, with micro-batches of 32
    sequences (Graphcore's pretrain_base_128: 4 IPUs per replica, the 12 layers 4 to an IPU
    after one IPU of embedding)."""
    return _bert_figure("bert_base", replicas, microbatches)


def _bert_figure(name: str, replicas: int, microbatches: int) -> Callable[[], tuple[float, str]]:
    """The pipelined step of `examples/bert/workloads.py:<name>` on `replicas` x 4 Bow IPUs."""

    def figure() -> tuple[float, str]:
        workloads = example("bert/workloads.py")
        axes = (workloads.DATA_AXIS, workloads.PIPELINE_AXIS)
        mesh = make_mesh((replicas, 4), axes, target=Target.bow())
        fun, args, kwargs = getattr(workloads, name)(mesh, microbatches=microbatches)
        compiled = jit(fun, **kwargs).lower(*args).compile(check_memory_fits=False)
        report = compiled.cost_report()
        sequences = samples_per_step(args, kwargs)  # the micro-batch x replicas x micro-batches
        rate = sequences / report.seconds
        return rate, _bert_derivation(report, name, replicas, sequences)

    return figure


def _bert_derivation(report: CostReport, name: str, replicas: int, sequences: int) -> str:
    stages = "; ".join(
        f"stage {s.stage} ({len(s.blocks)} blocks) {s.forward_cycles / 1e6:.2f} M forward + "
        f"{s.backward_cycles / 1e6:.2f} M backward cycles, peak tile {s.peak_tile_bytes:,} B"
        for s in report.stages
    )
    update = max(s.update_cycles for s in report.stages)
    return (
        f"{stages}; {len(report.pipeline_cycles):,} pipeline cycles "
        f"(bubble {100 * report.bubble_fraction:.1f}%), update {update / 1e6:.1f} M cycles; "
        f"{sequences:,} sequences / {report.seconds:.2f} s = {sequences / report.seconds:,.0f} "
        f"sequences/s; fits: {'yes' if report.fits else 'no'}. `ipujax cost-report "
        f"examples/bert/workloads.py:{name} --mesh dp={replicas},pp=4` shows it."
    )

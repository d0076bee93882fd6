"""What the benchmark runner measures: the meshes, the GPT step's shape, the cost-only workload,
the memory programs and the loops, as one `Setup`, either the full benchmark (`FULL`) or the
smoke run of `--quick` (`QUICK`), and the part of it a child process is sent
(`setup_payload`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MeshSpec:
    shape: tuple[int, ...]
    names: tuple[str, ...]

    @property
    def ipus(self) -> int:
        return math.prod(self.shape)

    @property
    def label(self) -> str:
        axes = " x ".join(f"{n}={s}" for n, s in zip(self.names, self.shape, strict=True))
        return f"{self.ipus} IPU" if self.ipus == 1 else f"{self.ipus} IPUs ({axes})"


ONE_IPU = MeshSpec((1,), ("ipu",))  # ipujax's default mesh
POD256 = MeshSpec((4, 8, 8), ("dp", "tp1", "tp2"))  # PopXL's GPT-3 175B mesh


@dataclass(frozen=True)
class Setup:
    """Everything the sections measure: the full benchmark (`FULL`) or a smoke run (`QUICK`)."""

    config: dict[str, int]  # model.Config fields of the GPT step
    batch: int  # global batch
    tiles: int | None  # tiles per IPU; None is the full Bow (1,472)
    meshes: tuple[MeshSpec, ...]  # run and compile; those of many IPUs also spmd
    cost_workload: str  # for gpt3: a factory of examples/gpt/workloads.py, or "step"
    cost_mesh: MeshSpec
    compiles: int  # compiles per side and mesh; compile times are their medians
    memory_tiles: tuple[int, ...]
    memory_programs: tuple[str, ...]  # "gpt" (the step above), "matmul" (a chain)
    matmul: tuple[int, int]  # the matmul chain: size, depth
    fidelity: str  # the published figures whose name contains this ("" for all)
    cnn_ipus: int  # the data-parallel CNN step's IPUs
    cnn_batch: int  # and its global batch
    scan: tuple[int, int, int]  # loops: the scan MLP's layers, width, batch
    scan_transformer: dict[str, int]  # loops: loops.scan_transformer's arguments
    scan_ipus: int  # loops: the data-parallel mesh of both scans
    popxl_layers: int  # loops: GPT-3 at PopXL's batch, this deep (96 is the model)
    popxl_mesh: MeshSpec
    plans: tuple[tuple[str, str], ...] = ()  # plan: (`ipujax plan` SPEC, --system) each

    @property
    def many(self) -> tuple[MeshSpec, ...]:
        return tuple(m for m in self.meshes if m.ipus > 1)


FULL = Setup(
    config={"vocab": 512, "seq": 128, "layers": 4, "d_model": 256, "heads": 8},
    batch=8,
    tiles=None,
    meshes=(ONE_IPU, MeshSpec((2, 2), ("dp", "tp")), MeshSpec((8, 8), ("dp", "tp"))),
    cost_workload="gpt3_175b",
    compiles=3,
    cost_mesh=POD256,
    memory_tiles=(16, 1472),
    memory_programs=("gpt", "matmul"),
    matmul=(2048, 4),
    fidelity="",
    cnn_ipus=16,
    cnn_batch=64,
    scan=(32, 256, 64),
    scan_transformer={"layers": 12, "seq": 128, "d_model": 256, "heads": 8, "batch": 16},
    scan_ipus=4,
    popxl_layers=96,
    popxl_mesh=POD256,
    plans=(
        ("examples/gpt/workloads.py:gpt3_175b", "pod256"),
        ("examples/bert/workloads.py:bert_large", "pod16"),
    ),
)
QUICK = Setup(
    config={"vocab": 256, "seq": 16, "layers": 2, "d_model": 32, "heads": 4},
    batch=4,
    tiles=16,
    meshes=(MeshSpec((2,), ("tp",)),),
    cost_workload="step",  # the GPT step above, shapes only
    compiles=1,
    cost_mesh=MeshSpec((2, 2), ("dp", "tp")),
    memory_tiles=(16, 32),
    memory_programs=("matmul",),
    matmul=(128, 2),
    fidelity="[16, 16] x [16, 16]",
    cnn_ipus=2,
    cnn_batch=4,
    scan=(4, 32, 8),
    scan_transformer={"layers": 2, "seq": 8, "d_model": 32, "heads": 4, "batch": 4},
    scan_ipus=2,
    popxl_layers=2,  # the Pod256 all the same: 2 layers compile in seconds
    popxl_mesh=POD256,
    plans=(("examples/gpt/workloads.py:tiny", "2"),),
)


def setup_payload(setup: Setup) -> dict[str, Any]:
    """The fields of `setup` the children need (meshes are passed on their own)."""
    return {"config": setup.config, "batch": setup.batch, "matmul": list(setup.matmul)}

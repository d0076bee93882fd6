"""The cnn section: a data-parallel CNN training step (the small ResNet of
`examples/resnet/model.py`: convolutions, batch norm, max pooling and their gradients, SGD with
momentum) through `ipujax.jit` on a mesh of Bow IPUs against `jax.jit` on the CPU: warm calls
interleaved, the median of each, their ratio and the largest difference between their
outputs."""

from __future__ import annotations

import importlib.util
import statistics
import sys
from types import ModuleType

import jax
import numpy as np
from measuring import log, max_abs_diff, timed
from programs import bow
from results import Section, goal, markdown_table
from setups import Setup
from spmd_compare import REPO

import ipujax

RATIO_GOAL = 1.5  # ipujax warm call / jax.jit warm call (issue 18)


def _example(name: str) -> ModuleType:
    """examples/resnet/<name>.py, loaded by path under the name its own loader uses."""
    full = f"resnet_example_{name}"
    if full not in sys.modules:
        path = REPO / "examples" / "resnet" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(full, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
    return sys.modules[full]


def cnn_section(setup: Setup, repeats: int) -> Section:
    model, sharding = _example("model"), _example("sharding")
    config = model.small_config()
    optimizer = model.make_optimizer("sgd")
    params, bn_state = model.init(config, jax.random.key(0))
    batch = setup.cnn_batch
    rng = np.random.default_rng(0)
    images = rng.normal(size=(batch, config.image_size, config.image_size, 3)).astype(np.float32)
    labels = rng.integers(0, config.num_classes, batch).astype(np.int32)
    args = (params, bn_state, model.init_optimizer(optimizer, params), images, labels)
    ipus = setup.cnn_ipus
    mesh = ipujax.make_mesh((ipus,), ("dp",), target=bow(setup.tiles))
    log(f"cnn: compiling the small ResNet's step on {ipus} IPUs and with jax.jit")
    step = model.make_train_step(optimizer, config)
    compiled = ipujax.jit(step, mesh=mesh, in_shardings=sharding.train_specs(mesh))
    compiled = compiled.lower(*args).compile()
    executable = jax.jit(model.make_train_step(optimizer, config)).lower(*args).compile()
    timed(lambda: compiled(*args))
    timed(lambda: executable(*args))
    ours, theirs = [], []
    for _ in range(repeats):
        seconds, mine = timed(lambda: compiled(*args))
        ours.append(seconds)
        seconds, reference = timed(lambda: executable(*args))
        theirs.append(seconds)
    ratio = statistics.median(ours) / statistics.median(theirs)
    diff = max_abs_diff(mine, reference)
    label = f"{ipus} IPUs (dp={ipus}), batch {batch}"
    header = ("mesh", "ipujax s", "jax.jit s", "ratio", f"goal <= {RATIO_GOAL}", "max abs diff")
    row = (
        label,
        f"{statistics.median(ours):.4f}",
        f"{statistics.median(theirs):.4f}",
        f"{ratio:.2f}",
        goal(ratio <= RATIO_GOAL),
        f"{diff:.1e}",
    )
    meaning = (
        f"Seconds per training step of the small ResNet of examples/resnet (32x32 images, "
        f"batch norm over the batch, max pooling, SGD with momentum), data parallel, the median "
        f"of {repeats} warm calls of each side, alternating; ratio = ipujax / jax.jit. max abs "
        "diff: the largest absolute difference between the two sides' outputs (parameters, "
        "running statistics, optimizer state, loss)."
    )
    return Section(
        "cnn",
        "Run time: a data-parallel CNN step, ipujax.jit against jax.jit",
        markdown_table(header, [row]),
        meaning,
        ((f"CNN run time ratio, {label}: {ratio:.2f}", ratio <= RATIO_GOAL),),
    )

"""The cnn section: a data-parallel CNN training step (the small ResNet of
`examples/resnet/model.py`: convolutions, batch norm, max pooling and their gradients, SGD with
momentum) through `ipujax.jit` on a mesh of Bow IPUs against `jax.jit` on the CPU: warm calls
interleaved, the median of each, their ratio and the largest difference between their
outputs."""

from __future__ import annotations

import statistics

import jax
import numpy as np
import spmd_compare  # noqa: F401  (it puts the repository and examples/ on sys.path)
from measuring import log, max_abs_diff, timed
from programs import bow
from results import Section, goal, markdown_table
from setups import Setup
from shared.load import example

import ipujax

RATIO_GOAL = 1.5  # ipujax warm call / jax.jit warm call (issue 18)


def cnn_section(setup: Setup, repeats: int) -> Section:
    model, sharding = example("resnet", "model"), example("resnet", "sharding")
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

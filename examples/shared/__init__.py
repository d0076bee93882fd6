"""What the example scripts share: loading each other by path, the training scripts' flags,
meshes and progress, and the transformer pieces of the GPT and BERT models.

    load.py         examples/<folder>/<name>.py by path, once, as `<folder>_example_<name>`
    flags.py        the IPU targets, the flags every train.py takes, one-line usage errors
    meshes.py       --mesh NAME=SIZE,..., the mesh of the flags, an axis's size
    progress.py     a training loop's bar, throughput, loss lines and check against jax.jit
    files.py        atomic writes (checkpoints, plots, cost reports)
    transformer.py  layer norm, attention, cross-entropy, weight decay, config properties

The scripts run by path (`python examples/gpt/train.py`, `ipujax cost-report
examples/gpt/workloads.py:tiny`), so Python puts their own folder on `sys.path`, not examples/.
Each example module that uses this package therefore opens with the same lines, which put
examples/ on `sys.path` once and import from here:

    if (EXAMPLES := str(Path(__file__).resolve().parents[1])) not in sys.path:
        sys.path.insert(0, EXAMPLES)  # examples/, for `shared`: see shared/__init__.py
    from shared import load

Whoever loads an example module by path (its folder's other scripts, the tests, the
benchmarks, `ipujax.fidelity`) needs nothing more.
"""

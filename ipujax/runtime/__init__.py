"""The runtime: runs a scheduled per-IPU program on the CPU with `jax.jit`'s numbers.

    passes           the runtime's rewrites of the program, in order (`RUNTIME_PASSES`)
    fused_sums       an all-reduce of a contraction as one contraction over the IPUs
    scalar_operands  broadcast scalars handed to binary ops as scalars
    devices          which mesh axes to spread over several real jax devices
    trips            loops whose trips only a run knows, counted as they run
    runner           the program as one jitted function (vmapped over mesh axes), or step by step

May import `lowering`'s and `partitioner`'s public names and itself; the API (`ipujax.stages`)
calls `runner.make_runner` on a compiled program's first call.
"""

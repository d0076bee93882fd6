"""The BSP runtime: runs a scheduled Program.

The whole program is one jitted jax function, so a call costs about one XLA call: each task's
kernel computes what its supersteps compute on the tiles, on tensors kept in logical order
(`tile_rules` says why). Step-by-step mode runs one task at a time, each jitted on its own, and
reports every task's results, for traces and debugging. 64-bit types are on inside, because
jax's own lowerings use u64 (see lowering).

Loops whose trips only a run knows count their trips as they run (`trips`): the program hands
the counts out after its outputs, and the `Runner` keeps the last run's for the cost report.

A mesh of many IPUs is the per-IPU program vmapped once per mesh axis. With several real jax
devices, the axes `devices.plan_devices` picks are split over them: the same jitted function,
with sharding constraints that XLA's SPMD partitioner follows (docs/distributed.md). The devices
may be those of several processes joined by `jax.distributed`; each process then places only its
own devices' shards of the arguments.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ipujax.runtime.devices import DevicePlan, default_device, plan_devices
from ipujax.runtime.passes import Placement, prepare
from ipujax.runtime.stochastic import keyed
from ipujax.runtime.trips import with_counters
from lowering import Value, local_mesh_axes
from partitioner import Built, ConfigError, Partitioned, Program, Sharding, Task, varying_over

Array = Any


# The runtime's XLA compile: LLVM at backend optimization level 1, not XLA's default 3. The
# kernels' heavy ops (dots, convolutions) call into Eigen or YNNPACK at any level, so warm calls
# ran within the machine's noise of level 3's (GPT step on 64 IPUs, CNN on 16: +-5%), while a
# first call, mostly this compile, took 0.47-0.71x as long for the flax block and 0.86-0.96x
# for the GPT step and the equinox MLP (benchmarks/run.py's programs on 4 and 64 IPUs, medians
# of three alternating runs).
COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}


def _jit(run: Callable[..., tuple], donate: Sequence[int], **shardings: Any) -> Any:
    """`run` jitted as the runtime compiles every program: `COMPILER_OPTIONS`, `donate`."""
    return jax.jit(
        run, donate_argnums=tuple(donate), compiler_options=COMPILER_OPTIONS, **shardings
    )


def _run_tasks(program: Program, flat: Sequence[Array]) -> tuple[Array, ...]:
    env: dict[Value, Array] = dict(zip(program.inputs, flat, strict=True))
    for task in program.tasks:
        results = task.kernel(*[env[v] for v in task.inputs])
        env.update(zip(task.op.results, results, strict=True))
    return tuple(env[v] for v in program.outputs)


_NO_MESH = jax.sharding.AbstractMesh((), ())


@dataclasses.dataclass(frozen=True)
class Runner:
    """A jitted function of the flat inputs, called with 64-bit types on; with a `device`, its
    uncommitted arguments go there rather than to jax's default device. The jitted function
    returns, after the program's outputs, the trips of each of `loops`; a call keeps them in
    `trips` (the last run's, as arrays, not waited for) and returns the outputs."""

    jitted: Any  # the jax.jit-wrapped function
    device: jax.Device | None = None
    # Spread over devices: the jit's in_shardings, which arguments are moved to first.
    shardings: tuple[NamedSharding, ...] | None = None
    loops: tuple[Value, ...] = ()  # the loops counted, by their first result
    trips: dict[Value, Array] = dataclasses.field(default_factory=dict, compare=False)

    def __call__(self, *flat: Array) -> tuple[Array, ...]:
        with jax.enable_x64(True), self._placement():
            if self.shardings is not None:
                flat = _placed(flat, self.shardings)
            out = self.jitted(*flat)
        if not self.loops:
            return out
        kept = len(out) - len(self.loops)
        self.trips.update(zip(self.loops, out[kept:], strict=True))
        return out[:kept]

    def lower(self, *flat: Array) -> jax.stages.Lowered:
        """jax's lowering of the runner for `flat`: `.compile().as_text()` is the XLA program
        the real devices run."""
        with jax.enable_x64(True), self._placement():
            return self.jitted.lower(*flat)

    @contextlib.contextmanager
    def _placement(self) -> Iterator[None]:
        """Out of the caller's mesh (a `jax.set_mesh` around the call names the user's axes,
        not the devices' this program is spread over), on `device` when there is one."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(jax.sharding.use_abstract_mesh(_NO_MESH))
            if self.device is not None:
                stack.enter_context(jax.default_device(self.device))
            yield


def _placed(flat: tuple[Array, ...], shardings: Sequence[NamedSharding]) -> tuple[Array, ...]:
    """The arguments on the devices the jitted function takes them on. jax.jit refuses a
    committed array sharded otherwise, and moves host data more slowly than one batched
    `device_put`; moving only the misplaced ones keeps the usual call, an earlier step's
    outputs fed back in, at a comparison per argument."""
    moved = [
        i
        for i, (x, s) in enumerate(zip(flat, shardings, strict=True))
        if getattr(x, "sharding", None) != s
    ]
    if not moved:
        return flat
    placed = list(flat)
    # Devices of this process only (always, with one process): one batched device_put.
    local = [i for i in moved if shardings[i].is_fully_addressable]
    arrays = jax.device_put([_via_host(flat[i]) for i in local], [shardings[i] for i in local])
    for i, x in zip(local, arrays, strict=True):
        placed[i] = x
    for i in moved:
        if not shardings[i].is_fully_addressable:
            placed[i] = _global(flat[i], shardings[i])
    return tuple(placed)


def _global(x: Array, sharding: NamedSharding) -> Array:
    """`x` on devices of several processes (jax.distributed). Host data, the same on every
    process as in any multi-controller program, is cut on each process into the shards of its
    own devices: jax.device_put would first compare it across processes, a collective of the
    whole array on every call. A global array sharded otherwise is resharded by device_put."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return jax.device_put(x, sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def _via_host(x: Array) -> Array:
    """A jax array on one CPU device as a numpy view of it (no copy): spreading it from the host
    is several times faster than jax's device-to-device copies on CPU (4 ms against 12 ms for the
    tiny GPT step's 86 arrays)."""
    if isinstance(x, jax.Array) and len(x.devices()) == 1:
        (device,) = x.devices()
        if device.platform == "cpu":
            return np.asarray(x)
    return x


def compile_program(
    program: Program,
    donate: Sequence[int] = (),
    verify: bool = False,
    loops: Collection[Value] = (),
    numerics: str = "exact",
) -> Runner:
    """The program, through the runtime's passes, as one jitted function of its flat inputs;
    `loops` count their trips. With numerics "ipu" the key's data is one more, last, input."""
    placement = Placement({}, numerics=numerics)
    program, counted = with_counters(prepare(program, placement, verify), loops)
    run = _keyed_if(numerics, lambda *flat: _run_tasks(program, flat))
    return Runner(_jit(run, donate), loops=counted)


def _keyed_if(numerics: str, run: Callable[..., tuple]) -> Callable[..., tuple]:
    """`run`, taking the stochastic rounding's key as its last argument under numerics "ipu"
    (`stochastic.keyed`); `run` itself under "exact"."""
    return run if numerics == "exact" else keyed(run)


def run_step_by_step(program: Program, flat: Sequence[Array]) -> Iterator[tuple[Task, tuple]]:
    """Runs one task at a time; yields each task and its results as logical arrays."""
    with jax.enable_x64(True):
        env: dict[Value, Array] = dict(zip(program.inputs, flat, strict=True))
        for task in program.tasks:
            results = jax.jit(task.kernel)(*[env[v] for v in task.inputs])
            env.update(zip(task.op.results, results, strict=True))
            yield task, tuple(results)


# ---- many IPUs: the per-IPU program vmapped over the mesh axes -------------------------------


def _split_input(x: Array, sharding: Sharding, axis_names: Sequence[str], sizes: dict) -> Array:
    """A global array as `[mesh axes it is split over..., *block]`, padded to divide."""
    parts: list[int] = []
    positions: dict[str, int] = {}
    pads = []
    for dim, axes in enumerate(sharding.dims):
        groups = math.prod(sizes[a] for a in axes)
        local = -(-x.shape[dim] // groups)
        pads.append((0, local * groups - x.shape[dim]))
        for a in axes:
            positions[a] = len(parts)
            parts.append(sizes[a])
        parts.append(local)
    if any(high for _, high in pads):
        x = jnp.pad(x, pads)
    x = jnp.reshape(x, parts)
    leading = [positions[a] for a in axis_names if a in positions]
    rest = [i for i in range(len(parts)) if i not in leading]
    return jnp.transpose(x, leading + rest)


def _join_output(
    x: Array, sharding: Sharding, shape: tuple[int, ...], axis_names: Sequence[str]
) -> Array:
    """The global array from `[mesh axes axis_names..., *block]` outputs."""
    used = {a for d in sharding.dims for a in d}
    x = x[tuple(slice(None) if a in used else 0 for a in axis_names)]
    kept = [a for a in axis_names if a in used]
    order: list[int] = []
    for dim, axes in enumerate(sharding.dims):
        order += [kept.index(a) for a in axes]
        order.append(len(kept) + dim)
    x = jnp.transpose(x, order)
    merged = [
        math.prod(x.shape[i] for i in range(len(order)) if order[i] in group)
        for group in _groups(sharding, kept)
    ]
    x = jnp.reshape(x, merged)
    return x[tuple(slice(0, n) for n in shape)]


def _groups(sharding: Sharding, kept: list[str]) -> list[set[int]]:
    return [
        {kept.index(a) for a in axes} | {len(kept) + dim} for dim, axes in enumerate(sharding.dims)
    ]


def _vmapped(
    program: Program,
    in_shardings: Sequence[Sharding],
    out_axes: Sequence[tuple[str, ...]],
    axis_names: Sequence[str],
    sizes: dict,
    devices: DevicePlan | None,
) -> Callable[..., tuple]:
    """The per-IPU program vmapped once per mesh axis, named so that its collectives are
    `jax.lax` collectives over the axis; output i has a leading dimension for each axis of
    `out_axes[i]`, in mesh order. A spread axis's batch dimension is its device axis
    (`spmd_axis_name`), which any sharding constraint inside keeps split."""

    def per_ipu(*flat: Array) -> tuple[Array, ...]:
        return _run_tasks(program, flat)

    run = per_ipu
    for axis in reversed(axis_names):
        in_axes = tuple(0 if axis in s.axes else None for s in in_shardings)
        outs = tuple(0 if axis in axes else None for axes in out_axes)
        spmd = devices.device_axes.get(axis) if devices is not None else None
        run = jax.vmap(
            run,
            in_axes=in_axes,
            out_axes=outs,
            axis_name=axis,
            axis_size=sizes[axis],
            spmd_axis_name=spmd,
        )
    return run


def compile_partitioned(
    program: Program,
    partitioned: Partitioned,
    axis_names: Sequence[str],
    sizes: dict,
    donate: Sequence[int] = (),
    devices: DevicePlan | None = None,
    verify: bool = False,
    loops: Collection[Value] = (),
    numerics: str = "exact",
) -> Runner:
    """The per-IPU program run on every IPU of the mesh at once, as one jitted function: global
    inputs split into `[mesh axes..., *block]`, the vmapped per-IPU program, outputs joined;
    after them, the most trips any IPU's copy of each of `loops` made.

    With a `DevicePlan`, the split inputs and the per-IPU outputs are constrained to lie split
    along the spread mesh axes over their devices, and XLA's SPMD partitioner gives each device
    its IPUs' share of every op in between; the per-IPU kernels and collectives are unchanged."""
    in_shardings = partitioned.input_shardings
    out_shardings = partitioned.output_shardings
    global_outputs = partitioned.global_graph.outputs
    on_one_device = set(axis_names) - set(devices.device_axes if devices else ())
    varying = varying_over(program.inputs, (t.op for t in program.tasks), in_shardings)
    program = prepare(program, Placement(sizes, on_one_device, varying, numerics), verify)
    # The mesh axes each output has a dimension for: those it differs over or is split over.
    # vmap broadcasts a result alike on every IPU if asked for a dimension it does not have.
    out_axes = [
        tuple(a for a in axis_names if a in varying[v] or a in s.axes)
        for v, s in zip(program.outputs, out_shardings, strict=True)
    ]
    program, counted = with_counters(program, loops)
    every_ipu = [tuple(axis_names)] * len(counted)  # each IPU's own count
    run = _vmapped(program, in_shardings, out_axes + every_ipu, axis_names, sizes, devices)

    def everything(*flat: Array) -> tuple[Array, ...]:
        shards = [
            _split_input(x, s, axis_names, sizes) for x, s in zip(flat, in_shardings, strict=True)
        ]
        if devices is not None:
            shards = [
                devices.constrain(x, [a for a in axis_names if a in s.axes])
                for x, s in zip(shards, in_shardings, strict=True)
            ]
        with local_mesh_axes(on_one_device):
            outputs = run(*shards)
        outputs, counts = outputs[: len(out_axes)], outputs[len(out_axes) :]
        if devices is not None:
            outputs = tuple(devices.constrain(y, a) for y, a in zip(outputs, out_axes, strict=True))
        joined = tuple(
            _join_output(y, s, v.shape, a)
            for y, s, v, a in zip(outputs, out_shardings, global_outputs, out_axes, strict=True)
        )
        return (*joined, *(jnp.max(c) for c in counts))

    run_all = _keyed_if(numerics, everything)
    if devices is None:
        return Runner(_jit(run_all, donate), loops=counted)
    return _spread(run_all, partitioned, sizes, devices, donate, counted, numerics != "exact")


def _spread(
    everything: Callable[..., tuple],
    partitioned: Partitioned,
    sizes: dict,
    devices: DevicePlan,
    donate: Sequence[int],
    loops: tuple[Value, ...],
    key: bool = False,
) -> Runner:
    """`everything` jitted with fixed shardings of its global inputs and outputs, so that outputs
    fed back in as the next step's inputs (weights, optimizer state) are already where the
    program wants them: left to XLA, their shardings need not match, and each new combination
    of argument shardings compiles the program again."""
    graph = partitioned.global_graph
    ins = tuple(
        devices.global_sharding(s, v.shape, sizes)
        for s, v in zip(partitioned.input_shardings, graph.inputs, strict=True)
    )
    outs = tuple(
        devices.global_sharding(s, v.shape, sizes)
        for s, v in zip(partitioned.output_shardings, graph.outputs, strict=True)
    )
    counts = (NamedSharding(devices.mesh, PartitionSpec()),) * len(loops)  # on every device
    if key:  # the stochastic rounding's key, the last argument, on every device
        ins += (NamedSharding(devices.mesh, PartitionSpec()),)
    jitted = _jit(everything, donate, in_shardings=ins, out_shardings=outs + counts)
    return Runner(jitted, shardings=ins, loops=loops)


def device_pool(devices: Sequence[jax.Device] | None) -> tuple[jax.Device, ...] | None:
    """A user's `devices=`, checked: None (every device jax sees) or at least one device."""
    if devices is None:
        return None
    if not tuple(devices):
        raise ConfigError("devices is empty: give at least one jax device, or None for all")
    return tuple(devices)


def make_runner(
    built: Built,
    donate: Sequence[int],
    devices: Sequence[jax.Device] | None,
    verify: bool = False,
    loops: Collection[Value] = (),
    numerics: str = "exact",
) -> tuple[Runner, tuple[jax.Device, ...]]:
    """The jitted runner of what `partitioner.build` made, and the real devices it uses: the
    mesh spread over `devices` (by default every device jax sees) where its axes divide, else
    one device. With `verify`, the runtime's passes are verified too; `loops` (by their first
    results) count their trips. With numerics "ipu", a call passes the key's data last."""
    pool = device_pool(devices) or tuple(jax.devices())
    mesh, program, partitioned = built.mesh, built.runnable, built.partitioned
    spread = None
    if partitioned is None:
        run = compile_program(program, donate, verify, loops, numerics)
    else:
        spread = plan_devices(partitioned, mesh.axis_names, mesh.shape, pool)
        run = compile_partitioned(
            program,
            partitioned,
            mesh.axis_names,
            mesh.shape,
            donate,
            spread,
            verify,
            loops,
            numerics,
        )
    if spread is not None:
        return run, spread.devices
    # One device: jax's default, unless the caller named another.
    default = default_device()
    device = default if devices is None else pool[0]
    if device == default:
        return run, (device,)
    return dataclasses.replace(run, device=device), (device,)

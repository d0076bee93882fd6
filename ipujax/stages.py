"""The staged objects of `ipujax.jit`, shaped like jax's (`jax.stages`): a `Lowered` program
(the IR, `as_text()`) compiles to a `Compiled` one (callable, with its BSP program, memory and
cost report).

`Lowered.compile` hands the IR, the mesh the lowering resolved and the jit's `partitioner.Options`
to `partitioner.build`; the runtime is made from what it builds on the first call. A loop whose
trips only a run knows is costed one trip until the program has run, then with the trips the
last run counted (`ipujax.loops`).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
from jax.sharding import PartitionSpec

from ipujax.analysis import MemoryAnalysis, cost_analysis, memory_analysis, named_shardings
from ipujax.boundary import api_boundary
from ipujax.caveats import standing_caveats
from ipujax.errors import ReplicationWarning
from ipujax.host_bound import warn_host_bound
from ipujax.loops import Loops, caveats, find_loops, recosted, warn_loops
from ipujax.numerics import call_key, numerics_caveats, with_numerics
from ipujax.options import JitOptions
from ipujax.report import CostReport, build_report
from ipujax.runtime.runner import Runner, device_pool, make_runner, run_step_by_step
from ipujax.what_if import Rebuild, sensitivity, what_if
from lowering import Graph, flatten_args, restore_keys, shorten_paths
from partitioner import (
    Built,
    ConfigError,
    Mesh,
    Options,
    Target,
    Task,
    build,
    explain,
    format_program,
    without_axis,
)


class Compiled:
    """A program scheduled on the virtual IPUs: callable, with its BSP program and cost report."""

    def __init__(
        self,
        graph: Graph,
        built: Built,
        donate: Sequence[int] = (),
        devices: Sequence[jax.Device] | None = None,
        runs: Callable[[], Built] | None = None,
        verify: bool = False,
        rebuild: Rebuild | None = None,
        loops: Loops | None = None,
        iterations: int = 1,
        numerics: str = "exact",
    ) -> None:
        self.graph = graph
        self.built = built
        self.program = built.program
        self.memory = built.memory
        self.mesh = built.mesh
        self.partitioned = built.partitioned
        self._loops = find_loops(built) if loops is None else loops
        self._numerics = numerics  # "ipu": float16 results rounded stochastically
        self._standing = standing_caveats(built, self._loops) + numerics_caveats(built, numerics)
        self._iterations = iterations  # device iterations: calls per host transfer
        self._report = build_report(
            built, caveats(self._loops, {}) + self._standing, self._iterations
        )
        self._counted: dict = {}  # the trips the report charges, by loop
        # The runner is made on the first call, so costing a program never makes it (0.4 s of
        # GPT-3's compile on a Pod256). A pipelined step is costed as its micro-batch's program
        # but runs the whole batch on one stage's mesh (pipelining never changes a value).
        self._runs = runs if runs is not None else lambda: built
        self._donate, self._device_pool = tuple(donate), device_pool(devices)
        self._run: Runner | None = None
        self._devices: tuple[jax.Device, ...] = ()
        self._verify = verify  # the runtime's passes verified too
        # The same program built on another Target (`what_if`); by default, on none.
        self._rebuild = rebuild

    def _runner(self) -> Runner:
        if self._run is None:
            self._run, self._devices = make_runner(
                self._runs(),
                self._donate,
                self._device_pool,
                self._verify,
                self._loops.counted,
                self._numerics,
            )
        return self._run

    @property
    def run(self) -> Runner:
        """The jitted function of the flat inputs that runs the program (made on first use)."""
        return self._runner()

    @api_boundary
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Spread over devices, the runner places host data on them itself (see runtime).
        run = self._runner()
        host = run.shardings is not None
        with jax.enable_x64(True):
            flat = flatten_args(self.graph, args, kwargs, host)
        if self._numerics != "exact":  # the stochastic rounding's key, the runner's last input
            flat.append(call_key())
        outputs = restore_keys(self.graph, list(run(*flat)))
        return jax.tree.unflatten(self.graph.out_tree, outputs)

    @property
    def devices(self) -> tuple[jax.Device, ...]:
        """The real jax devices the program runs on: the mesh's IPUs are spread over several
        when several are visible and a mesh axis divides among them, else one device."""
        self._runner()
        return self._devices

    def cost_report(self) -> CostReport:
        """The step's cost; a loop whose trips only a run knows is charged one trip until the
        program has run, then the trips it made in the last run (the caveats say which)."""
        trips = {} if self._run is None else {k: int(v) for k, v in self._run.trips.items()}
        if trips and trips != self._counted:
            built = recosted(self.built, trips)
            every = caveats(self._loops, trips) + self._standing
            self._report = build_report(built, every, self._iterations)
            self._counted = trips
        return with_numerics(self._report, self._numerics)

    def what_if(self, **changes: Any) -> CostReport:
        """The report of this program on the machine with `changes` to its `Target`: a field's
        new value, or a factor such as `ipu_link_bytes_per_second="2x"`; built again, so plans
        that depend on the machine follow it (see `ipujax.what_if`)."""
        return what_if(self._rebuilt(), self.mesh.target, changes)

    def sensitivity(self) -> dict[str, float]:
        """The step's elasticity to each main parameter of the machine (clock, exchange, links,
        streaming, host, memory), each doubled in turn: -1 where that rate alone bounds it."""
        return sensitivity(self._rebuilt(), self.mesh.target, self.cost_report())

    def _rebuilt(self) -> Rebuild:
        if self._rebuild is None:
            raise ConfigError("this Compiled was made without its program; compile it again")
        return self._rebuild

    def cost_analysis(self) -> dict[str, float]:
        """jax's `Compiled.cost_analysis()` keys (flops, transcendentals, bytes accessed) for
        the program each IPU runs, and the step's predicted seconds."""
        return cost_analysis(self.built, self.cost_report().seconds)

    def memory_analysis(self) -> MemoryAnalysis:
        """Bytes on one IPU under jax's `CompiledMemoryStats` names, and the fullest tile."""
        return memory_analysis(self.built)

    @property
    def input_shardings(self) -> Any:
        """The inputs' shardings as `NamedSharding`s (over the mesh's `AbstractMesh`), in the
        arguments' tree: `(args, kwargs)`, as jax gives them."""
        return named_shardings(self.built, "inputs", self.graph.in_tree)

    @property
    def output_shardings(self) -> Any:
        """The results' shardings as `NamedSharding`s, in the results' tree."""
        return named_shardings(self.built, "outputs", self.graph.out_tree)

    def as_text(self) -> str:
        text = format_program(self.program, self.built.graph, self.built.target)
        if self.partitioned is None:
            return text
        return explain(self.partitioned, self.mesh) + "\n\n" + text

    @property
    def replica_axes(self) -> tuple[str, ...]:
        """The mesh axes the program runs data parallel over: derived from the shardings, or
        as given by `ipujax.jit(..., replica_axes=...)`."""
        return self.built.replica_axes

    def explain(self) -> str:
        """Each tensor's sharding and where it came from, the replica axes, and the ops that
        forced a split tensor whole."""
        if self.partitioned is None:
            return f"one IPU ({self.mesh}): every tensor is whole"
        replicas = ", ".join(self.replica_axes) or "none"
        return f"{explain(self.partitioned, self.mesh)}\nreplica axes: {replicas}"

    def step_by_step(self, *args: Any, **kwargs: Any) -> Iterator[tuple[Task, tuple]]:
        """Runs one task (an op's supersteps) at a time, yielding each with its results."""
        if self.partitioned is not None:
            raise ConfigError("step_by_step runs programs of one IPU; use a mesh of one IPU")
        if self._numerics != "exact":
            raise ConfigError("step_by_step runs jax.jit's numbers; compile with numerics='exact'")
        with jax.enable_x64(True):
            flat = flatten_args(self.graph, args, kwargs)
        yield from run_step_by_step(self.built.runnable, flat)


class Lowered:
    """A traced and imported program, ready to compile for the mesh its lowering resolved."""

    def __init__(
        self,
        graph: Graph,
        mesh: Mesh,
        options: JitOptions,
        donate: Sequence[int],
        in_specs: Sequence[PartitionSpec | None] = (),
        out_specs: Sequence[PartitionSpec | None] = (),
        micro: tuple[Graph, tuple[int, ...]] | None = None,
    ) -> None:
        self.graph = graph
        self._mesh = mesh
        self._options = options
        self._donate = tuple(donate)
        self._in_specs = tuple(in_specs)
        self._out_specs = tuple(out_specs)
        self._micro = micro  # pipelined: one micro-batch's program and its batch inputs

    def as_text(self) -> str:
        return str(self.graph)

    def build_arguments(
        self, check_memory_fits: bool = True
    ) -> tuple[Graph, Mesh, tuple, tuple, Options]:
        """What `compile` hands `partitioner.build`: the program (a pipeline's micro-batch, with
        the flat inputs that carry the batch in its options), the mesh, the specs, the options."""
        how = dataclasses.replace(self._options.build, check_memory=check_memory_fits)
        graph = self.graph
        if self._micro is not None:
            graph, batch = self._micro
            assert how.pipeline is not None  # a micro-batch program is traced only for one
            how = dataclasses.replace(how, batch_inputs=batch)
        return graph, self._mesh, self._in_specs, self._out_specs, how

    @api_boundary
    def compile(self, *, check_memory_fits: bool = True) -> Compiled:
        graph, mesh, in_specs, out_specs, how = self.build_arguments(check_memory_fits)
        built = build(graph, mesh, in_specs, out_specs, how)
        loops = _warn(built)
        runs = None
        if self._micro is None:
            warn_host_bound(built, how.resident_inputs)
        else:
            runs = self._runs(self._options.build)
        return Compiled(
            self.graph,
            built,
            self._donate,
            self._options.devices,
            runs,
            how.verify,
            self._rebuild(graph, how),
            loops,
            self._options.device_iterations,
            numerics=self._options.numerics,
        )

    def _rebuild(self, graph: Graph, how: Options) -> Rebuild:
        """`graph` built as `how` says on this mesh with another Target, its memory not checked
        (a what-if asks what the step would cost, fitting or not)."""

        def on(target: Target) -> Built:
            mesh = dataclasses.replace(self._mesh, target=target)
            options = dataclasses.replace(how, check_memory=False, verify=False)
            with warnings.catch_warnings():  # the compile warned already, once
                warnings.simplefilter("ignore")
                return build(graph, mesh, self._in_specs, self._out_specs, options)

        return on

    def _runs(self, how: Options) -> Callable[[], Built]:
        """The build a pipelined step runs: the whole batch on one stage's mesh, unpipelined
        (pipelining never changes a value), its memory not checked."""
        assert how.pipeline is not None
        return functools.partial(
            build,
            self.graph,
            without_axis(self._mesh, how.pipeline.axis),
            self._in_specs,
            self._out_specs,
            dataclasses.replace(how, check_memory=False, pipeline=None),
        )


def _warn(built: Built) -> Loops:
    """The compile's warnings of ops that gathered split tensors and of loops whose cost rests
    on an assumption (`ipujax.loops`), each kind once; those loops, found once per compile."""
    loops = find_loops(built)
    _warn_forced_whole(built)
    warn_loops(loops)
    return loops


def _warn_forced_whole(built: Built) -> None:
    """One warning per compile when ops gathered split tensors to run whole on every IPU."""
    forced = built.partitioned.forced_whole if built.partitioned is not None else ()
    if not forced:
        return
    more = f" (and {len(forced) - 1} more)" if len(forced) > 1 else ""
    warnings.warn(
        shorten_paths(
            f"{forced[0]}{more}: it has no rule to run split, so every IPU holds the whole "
            "tensor; Compiled.explain() lists them all. Shard its operands another way, or "
            "accept the gather."
        ),
        ReplicationWarning,
        stacklevel=5,  # the caller of compile(), past `_warn` and the API boundary
    )

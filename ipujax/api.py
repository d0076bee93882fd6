"""`ipujax.jit`: staged compilation for the virtual IPU, shaped like `jax.jit`.

    jitted = ipujax.jit(fun)                  # a Jitted: callable, cached by shapes and dtypes
    lowered = jitted.lower(*args)             # Lowered: the IR (`as_text()`)
    compiled = lowered.compile()              # Compiled: the BSP program, its memory and cost
    compiled(*args); compiled.cost_report()
    compiled.devices                          # the real jax devices it runs on

The stages: lower (trace to StableHLO, import to the IR) -> `partitioner.build` (partition,
schedule, phases, memory, cost) -> the runtime and the cost report. Arguments may be
`jax.ShapeDtypeStruct`s, so a program can be compiled and costed without data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, PartitionSpec

from ipujax.analysis import MemoryAnalysis, cost_analysis, memory_analysis, named_shardings
from ipujax.boundary import api_boundary
from ipujax.errors import ReplicationWarning
from ipujax.report import CostReport, build_report
from ipujax.runtime import Runner, device_pool, make_runner, run_step_by_step
from ipujax.specs import input_specs, output_specs
from lowering import (
    SHARD_MAP_DETAIL,
    Graph,
    UnsupportedOpError,
    eliminate_dead_code,
    flatten_args,
    lower,
    raised_at,
    restore_keys,
    shorten_paths,
)
from partitioner import (
    BUFFER_BYTES,
    Built,
    ConfigError,
    Mesh,
    Options,
    Pipeline,
    Task,
    active_mesh,
    build,
    default_mesh,
    explain,
    format_program,
    make_mesh,
    user_shardings,
    without_axis,
)

VERIFY_ENV = "IPUJAX_VERIFY"


def _verify_requested() -> bool:
    """Whether to verify each per-IPU program's IR after partitioning (IPUJAX_VERIFY=1): a
    debug aid, on in ipujax's own tests."""
    return os.environ.get(VERIFY_ENV, "").lower() not in ("", "0", "off", "false")


@dataclass(frozen=True)
class _Options:
    mesh: Mesh | None  # None: the mesh in context when the function is traced
    in_shardings: Any
    out_shardings: Any
    static_argnums: tuple[int, ...]
    static_argnames: tuple[str, ...]
    donate_argnums: tuple[int, ...]
    phases: Any
    devices: tuple[jax.Device, ...] | None = None
    replica_axes: tuple[str, ...] | None = None
    collective_buffer_bytes: int = BUFFER_BYTES
    pipeline: Pipeline | None = None
    traced_under: AbstractMesh | None = None  # a jax mesh's own abstract mesh, when given one


class Compiled:
    """A program scheduled on the virtual IPUs: callable, with its BSP program and cost report."""

    def __init__(
        self,
        graph: Graph,
        built: Built,
        donate: Sequence[int] = (),
        devices: Sequence[jax.Device] | None = None,
        runs: Callable[[], Built] | None = None,
    ) -> None:
        self.graph = graph
        self.built = built
        self.program = built.program
        self.memory = built.memory
        self.mesh = built.mesh
        self.partitioned = built.partitioned
        self._report = build_report(built)
        # The runner is made on the first call, so costing a program never makes it (0.4 s of
        # GPT-3's compile on a Pod256). A pipelined step is costed as its micro-batch's program
        # but runs the whole batch on one stage's mesh (pipelining never changes a value).
        self._runs = runs if runs is not None else lambda: built
        self._donate, self._device_pool = tuple(donate), device_pool(devices)
        self._run: Runner | None = None
        self._devices: tuple[jax.Device, ...] = ()

    def _runner(self) -> Runner:
        if self._run is None:
            self._run, self._devices = make_runner(self._runs(), self._donate, self._device_pool)
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
        outputs = restore_keys(self.graph, list(run(*flat)))
        return jax.tree.unflatten(self.graph.out_tree, outputs)

    @property
    def devices(self) -> tuple[jax.Device, ...]:
        """The real jax devices the program runs on: the mesh's IPUs are spread over several
        when several are visible and a mesh axis divides among them, else one device."""
        self._runner()
        return self._devices

    def cost_report(self) -> CostReport:
        return self._report

    def cost_analysis(self) -> dict[str, float]:
        """jax's `Compiled.cost_analysis()` keys (flops, transcendentals, bytes accessed) for
        the program each IPU runs, and the step's predicted seconds."""
        return cost_analysis(self.built, self._report.seconds)

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
        with jax.enable_x64(True):
            flat = flatten_args(self.graph, args, kwargs)
        yield from run_step_by_step(self.program, flat)


class Lowered:
    """A traced and imported program, ready to compile for the mesh's target."""

    def __init__(
        self,
        graph: Graph,
        options: _Options,
        donate: Sequence[int],
        in_specs: Sequence[PartitionSpec | None] = (),
        out_specs: Sequence[PartitionSpec | None] = (),
        micro: tuple[Graph, tuple[int, ...]] | None = None,
    ) -> None:
        self.graph = graph
        self._options = options
        self._donate = tuple(donate)
        self._in_specs = tuple(in_specs)
        self._out_specs = tuple(out_specs)
        self._micro = micro  # pipelined: one micro-batch's program and its batch inputs

    def as_text(self) -> str:
        return str(self.graph)

    @api_boundary
    def compile(self, *, check_memory_fits: bool = True) -> Compiled:
        options = self._options
        how = Options(
            phases=options.phases,
            replica_axes=options.replica_axes,
            collective_buffer_bytes=options.collective_buffer_bytes,
            check_memory=check_memory_fits,
            verify=_verify_requested(),
        )
        mesh, _ = _in_context(options)
        if self._micro is None:
            built = build(self.graph, mesh, self._in_specs, self._out_specs, how)
            _warn_forced_whole(built)
            return Compiled(self.graph, built, self._donate, options.devices)
        micro, batch = self._micro
        assert options.pipeline is not None  # a micro-batch program is traced only for one
        costed = dataclasses.replace(how, pipeline=options.pipeline, batch_inputs=batch)
        built = build(micro, mesh, self._in_specs, self._out_specs, costed)
        _warn_forced_whole(built)
        stage_mesh = without_axis(mesh, options.pipeline.axis)
        runs = functools.partial(
            build,
            self.graph,
            stage_mesh,
            self._in_specs,
            self._out_specs,
            dataclasses.replace(how, check_memory=False),
        )
        return Compiled(self.graph, built, self._donate, options.devices, runs)


def _warn_forced_whole(built: Built) -> None:
    """One warning per compile when ops gathered split tensors to run whole on every IPU."""
    forced = built.partitioned.forced_whole if built.partitioned is not None else ()
    if not forced:
        return
    more = f" (and {len(forced) - 1} more)" if len(forced) > 1 else ""
    warnings.warn(
        f"{shorten_paths(str(forced[0]))}{more}: it has no rule to run split, so every IPU "
        "holds the whole tensor; "
        "Compiled.explain() lists them all. Shard its operands another way, or accept the "
        "gather.",
        ReplicationWarning,
        stacklevel=4,  # the caller of compile(), past the API boundary
    )


def _leaf_key(leaf: Any) -> Any:
    if isinstance(leaf, (bool, int, float, complex)):
        return type(leaf).__name__
    return (tuple(np.shape(leaf)), str(getattr(leaf, "dtype", type(leaf).__name__)))


class Jitted:
    """What `ipujax.jit` returns: call it, or `lower` it; compiled programs are cached."""

    def __init__(self, fun: Callable[..., Any], options: _Options) -> None:
        self._fun = fun
        self._options = options
        self._cache: dict[Any, Compiled] = {}
        functools.update_wrapper(self, fun)

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        return _BoundJitted(self, instance)

    def _static(self, count: int) -> tuple[set[int], set[str]]:
        """Static positions and names; like jax.jit, a static parameter is static whether it
        is passed by position or by keyword."""
        positions = {i % count for i in self._options.static_argnums if -count <= i < count}
        names = set(self._options.static_argnames)
        try:
            params = list(inspect.signature(self._fun).parameters)
        except (TypeError, ValueError):
            return positions, names
        positions |= {i for i, name in enumerate(params[:count]) if name in names}
        names |= {params[i] for i in self._options.static_argnums if 0 <= i < len(params)}
        return positions, names

    def _split(self, args: tuple, kwargs: dict) -> tuple[Callable[..., Any], tuple, dict, Any]:
        """The function of the dynamic arguments only, with the static ones closed over."""
        count = len(args)
        positions, names = self._static(count)
        statics = {i: args[i] for i in sorted(positions)}
        static_kw = {k: v for k, v in kwargs.items() if k in names}
        dyn_args = tuple(a for i, a in enumerate(args) if i not in statics)
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in static_kw}
        fun = self._fun

        def dynamic(*dargs: Any, **dkwargs: Any) -> Any:
            it = iter(dargs)
            full = [statics[i] if i in statics else next(it) for i in range(count)]
            return fun(*full, **dkwargs, **static_kw)

        key = (tuple(statics.items()), tuple(sorted(static_kw.items())))
        if not statics and not static_kw:
            return fun, dyn_args, dyn_kwargs, key
        _name_parameters(dynamic, fun, set(statics), set(static_kw))
        return dynamic, dyn_args, dyn_kwargs, key

    def _leaf_ranges(self, dyn_args: tuple, count: int) -> list[tuple[int, range]]:
        """Each dynamic argument's position and the flat input indices of its leaves."""
        positions, _ = self._static(count)
        dynamic_positions = [i for i in range(count) if i not in positions]
        out, offset = [], 0
        for position, arg in zip(dynamic_positions, dyn_args, strict=True):
            leaves = len(jax.tree.leaves(arg))
            out.append((position, range(offset, offset + leaves)))
            offset += leaves
        return out

    def _donated(self, dyn_args: tuple, count: int) -> list[int]:
        """Flat input indices of the donated arguments' leaves."""
        donated = self._options.donate_argnums
        return [i for p, flat in self._leaf_ranges(dyn_args, count) if p in donated for i in flat]

    @api_boundary
    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        dynamic, dyn_args, dyn_kwargs, _ = self._split(args, kwargs)
        mesh, traced_under = _in_context(self._options)
        options = dataclasses.replace(self._options, mesh=mesh, traced_under=traced_under)
        graph = _traced(dynamic, dyn_args, dyn_kwargs, traced_under)
        in_specs = input_specs(self._options.in_shardings, dyn_args, dyn_kwargs)
        out_specs = output_specs(self._options.out_shardings, graph.out_tree)
        pipeline = options.pipeline
        # Pipelined, tensors split over the mesh without the pipeline axis.
        split_over = mesh if pipeline is None else without_axis(mesh, pipeline.axis)
        user_shardings(graph, split_over.shape, in_specs, out_specs)
        micro = None
        if pipeline is not None:
            micro = self._micro_batch(dynamic, args, dyn_args, dyn_kwargs, traced_under)
        donate = self._donated(dyn_args, len(args))
        return Lowered(graph, options, donate, in_specs, out_specs, micro)

    def _micro_batch(
        self,
        dynamic: Callable[..., Any],
        args: tuple,
        dyn_args: tuple,
        dyn_kwargs: dict,
        traced_under: AbstractMesh,
    ) -> tuple[Graph, tuple[int, ...]]:
        """One micro-batch's program: the batch arguments' leading dimension divided by the
        pipeline's micro-batches; and the flat inputs that carry the batch."""
        pipeline = self._options.pipeline
        assert pipeline is not None
        ranges = self._leaf_ranges(dyn_args, len(args))
        wanted = pipeline.batch_argnums
        if wanted is None:
            wanted = (ranges[-1][0],) if ranges else ()
        wanted = tuple(i % len(args) for i in wanted if -len(args) <= i < len(args))
        batch = [i for p, flat in ranges if p in wanted for i in flat]
        if not batch:
            raise ConfigError(
                f"Pipeline(batch_argnums={pipeline.batch_argnums}) names no argument of the "
                f"{len(args)} given; say which positional arguments carry the batch"
            )
        micro_args = [
            jax.tree.map(lambda x, p=p: _split_batch(x, pipeline.microbatches, p), arg)
            if p in wanted
            else arg
            for (p, _), arg in zip(ranges, dyn_args, strict=True)
        ]
        micro = _traced(dynamic, micro_args, dyn_kwargs, traced_under)
        return micro, tuple(batch)

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """The results' shapes and dtypes, as `jax.eval_shape` gives them."""
        return jax.eval_shape(self._fun, *args, **kwargs)

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        """jax's trace of the function (`jax.jit(fun).trace`), its jaxpr and more."""
        return jax.jit(
            self._fun,
            static_argnums=self._options.static_argnums,
            static_argnames=self._options.static_argnames,
        ).trace(*args, **kwargs)

    @api_boundary
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _, dyn_args, dyn_kwargs, static_key = self._split(args, kwargs)
        leaves, tree = jax.tree.flatten((dyn_args, dyn_kwargs))
        mesh, _ = _in_context(self._options)
        key = (static_key, tree, tuple(_leaf_key(x) for x in leaves), mesh)
        compiled = self._cache.get(key)
        if compiled is None:
            compiled = self._cache[key] = self.lower(*args, **kwargs).compile()
        return compiled(*dyn_args, **dyn_kwargs)


@dataclass
class _BoundJitted:
    """A jitted method bound to its instance, which becomes the first argument."""

    jitted: Jitted
    instance: Any = field(repr=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.jitted(self.instance, *args, **kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        return self.jitted.lower(self.instance, *args, **kwargs)


def _name_parameters(dynamic: Any, fun: Callable[..., Any], positions: set, names: set) -> None:
    """Gives the wrapper the user's signature minus the static parameters, so that jax names
    the arguments (and ipujax's reports name the tensors) as the user did."""
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        return
    kept = [p for i, p in enumerate(params) if i not in positions and p.name not in names]
    dynamic.__signature__ = inspect.Signature(kept)


def _in_context(options: _Options) -> tuple[Mesh, AbstractMesh]:
    """The mesh a call runs on and the jax mesh it is traced under: the mesh `jit` was given,
    else the innermost `with mesh:` block's, else the one `jax.set_mesh` made current (traced
    under its Auto twin), else one IPU. An ipujax mesh is traced under its abstract twin."""
    mesh = options.mesh or active_mesh()
    if mesh is None and not (current := jax.sharding.get_abstract_mesh()).empty:
        return as_mesh(current), _auto(current)
    mesh = mesh or default_mesh()
    return mesh, options.traced_under or AbstractMesh(mesh.axis_shapes, mesh.axis_names)


def as_mesh(mesh: Any) -> Mesh:
    """An ipujax mesh from `mesh=`: an ipujax `Mesh`, a `jax.sharding.Mesh` or `AbstractMesh`
    (its axis names and sizes, on Bow IPUs: `ipujax.make_mesh(..., target=)` picks another),
    or None (one IPU)."""
    if mesh is None:
        return default_mesh()
    if isinstance(mesh, Mesh):
        return mesh
    if isinstance(mesh, (jax.sharding.Mesh, AbstractMesh)):
        return make_mesh(tuple(mesh.axis_sizes), tuple(mesh.axis_names))
    raise ConfigError(
        f"ipujax.jit(mesh=...) takes an ipujax.Mesh or a jax.sharding.Mesh, got "
        f"{type(mesh).__name__}; build one with ipujax.make_mesh(sizes, names)"
    )


@contextlib.contextmanager
def _shard_map_refused() -> Iterator[None]:
    """jax's refusal of a `shard_map` whose mesh is not the one traced under (an Explicit one),
    as ipujax's refusal of every `shard_map`, at the user's line."""
    try:
        yield
    except ValueError as error:
        if "shard_map" not in str(error):
            raise
        raise UnsupportedOpError("shard_map", raised_at(error), SHARD_MAP_DETAIL) from None


def _jax_twin(mesh: Any) -> AbstractMesh | None:
    """The abstract mesh to trace under when `jit` is given a jax mesh, else None."""
    if isinstance(mesh, jax.sharding.Mesh):
        return _auto(mesh.abstract_mesh)
    return _auto(mesh) if isinstance(mesh, AbstractMesh) else None


def _auto(mesh: AbstractMesh) -> AbstractMesh:
    """A jax mesh with every axis Auto: shardings stay out of the traced types (the partitioner
    chooses them), and a `shard_map` over an Auto mesh finds it current."""
    return mesh.update_axis_types(dict.fromkeys(mesh.axis_names, jax.sharding.AxisType.Auto))


def _traced(
    fun: Callable[..., Any], args: Sequence[Any], kwargs: dict, traced_under: AbstractMesh
) -> Graph:
    """`fun` traced and imported, dead code dropped. Under the mesh's abstract twin,
    `with_sharding_constraint(x, P("tp"))` traces; under a jax mesh's own, so does a
    `shard_map` over it (which is refused at the user's line)."""
    with jax.sharding.use_abstract_mesh(traced_under), _shard_map_refused():
        return eliminate_dead_code(lower(fun, *args, **kwargs))


def _split_batch(leaf: Any, microbatches: int, position: int) -> jax.ShapeDtypeStruct:
    """A batch leaf's micro-batch: its leading dimension divided by the micro-batches."""
    shape = tuple(np.shape(leaf))
    if not shape or shape[0] % microbatches:
        rows = shape[0] if shape else "no"
        raise ConfigError(
            f"Pipeline(microbatches={microbatches}): argument {position} has {rows} rows in its "
            f"leading (batch) dimension, shape {shape}, which do not split into "
            f"{microbatches} micro-batches; give a batch that is a multiple of {microbatches}"
        )
    dtype = getattr(leaf, "dtype", None) or np.asarray(leaf).dtype
    return jax.ShapeDtypeStruct((shape[0] // microbatches, *shape[1:]), dtype)


def _checked_pipeline(pipeline: Any) -> Pipeline | None:
    if pipeline is None or isinstance(pipeline, Pipeline):
        return pipeline
    raise ConfigError(
        f"pipeline={pipeline!r}: give an ipujax.Pipeline(axis=..., stages=..., microbatches=...)"
    )


def _as_tuple(value: int | str | Sequence[Any] | None) -> tuple:
    if value is None:
        return ()
    if isinstance(value, (int, str)):
        return (value,)
    return tuple(value)


def jit(
    fun: Callable[..., Any] | None = None,
    *,
    mesh: Mesh | None = None,
    in_shardings: Any = None,
    out_shardings: Any = None,
    static_argnums: int | Sequence[int] = (),
    static_argnames: str | Sequence[str] = (),
    donate_argnums: int | Sequence[int] = (),
    phases: Any = None,
    devices: Sequence[jax.Device] | None = None,
    replica_axes: str | Sequence[str] | None = None,
    collective_buffer_bytes: int = BUFFER_BYTES,
    pipeline: Pipeline | None = None,
) -> Any:
    """Compiles `fun` for a virtual IPU system; use like `jax.jit`, with or without arguments.

    `mesh` is an ipujax or jax mesh; without one, a call runs on the mesh of the `with mesh:`
    block (or `jax.set_mesh`) it is traced in, else on one IPU.

    `devices` are the real jax devices a mesh of many IPUs may be spread over (default: all of
    `jax.devices()`); `devices=jax.devices()[:1]` keeps everything on one device.
    `replica_axes` names the mesh axes the program runs data parallel over (replicated tensor
    sharding and the replicas' costs follow them); by default they are derived: an axis over
    which some input is split and most input bytes are replicated. All-reduces over the same
    axes that can run at one point run as one, up to `collective_buffer_bytes` (10 MiB, as
    Graphcore's CNN examples set; 0 keeps every all-reduce apart)."""
    options = _Options(
        mesh=None if mesh is None else as_mesh(mesh),
        traced_under=_jax_twin(mesh),
        in_shardings=in_shardings,
        out_shardings=out_shardings,
        static_argnums=_as_tuple(static_argnums),
        static_argnames=_as_tuple(static_argnames),
        donate_argnums=_as_tuple(donate_argnums),
        phases=phases,
        devices=None if devices is None else tuple(devices),
        replica_axes=None if replica_axes is None else _as_tuple(replica_axes),
        collective_buffer_bytes=collective_buffer_bytes,
        pipeline=_checked_pipeline(pipeline),
    )
    if fun is None:
        return lambda f: Jitted(f, options)
    if not callable(fun):
        raise ConfigError(f"ipujax.jit needs a callable, got {type(fun).__name__}")
    return Jitted(fun, options)

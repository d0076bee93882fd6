"""`ipujax.jit`: staged compilation for the virtual IPU, shaped like `jax.jit`.

    jitted = ipujax.jit(fun)                  # a Jitted: callable, cached by shapes and dtypes
    lowered = jitted.lower(*args)             # Lowered: the IR (`as_text()`)
    compiled = lowered.compile()              # Compiled: the BSP program, its memory and cost
    compiled(*args); compiled.cost_report()
    compiled.devices                          # the real jax devices it runs on

The stages: lower (trace to StableHLO, import to the IR; `tracing`, `arguments`, `microbatch`,
under the mesh `meshes` resolves) -> `partitioner.build` (partition, schedule, phases, memory,
cost; `stages`) -> the runtime and the cost report. Arguments may be `jax.ShapeDtypeStruct`s, so
a program can be compiled and costed without data.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
from jax.sharding import AbstractMesh

from ipujax.arguments import Call, cache_key, donated_leaves, split_call
from ipujax.boundary import api_boundary
from ipujax.errors import InsideJaxWarning
from ipujax.host_bound import user_stacklevel
from ipujax.latency import checked_iterations
from ipujax.meshes import as_mesh, explicit, jax_twin, mesh_in_context
from ipujax.microbatch import micro_batch
from ipujax.numerics import checked_numerics
from ipujax.options import JitOptions, as_tuple, build_options
from ipujax.resident import check_against, checked_argnames, checked_argnums, resident_leaves
from ipujax.specs import input_specs, output_specs
from ipujax.stages import Compiled, Lowered
from ipujax.tracing import traced, typed
from lowering import Graph
from partitioner import (
    BUFFER_BYTES,
    ConfigError,
    Mesh,
    Pipeline,
    user_shardings,
    without_axis,
)


class Jitted:
    """What `ipujax.jit` returns: call it, or `lower` it; compiled programs are cached."""

    def __init__(self, fun: Callable[..., Any], options: JitOptions) -> None:
        check_against(fun, options)
        self._fun = fun
        self._options = options
        self._cache: dict[Any, Compiled] = {}
        functools.update_wrapper(self, fun)

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        return _BoundJitted(self, instance)

    def _call(self, args: tuple, kwargs: dict) -> Call:
        options = self._options
        return split_call(self._fun, args, kwargs, options.static_argnums, options.static_argnames)

    def _mesh(self) -> tuple[Mesh, AbstractMesh]:
        return mesh_in_context(self._options.mesh, self._options.traced_under)

    @api_boundary
    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        return self._lower(self._call(args, kwargs), *self._mesh())

    def _lower(self, call: Call, mesh: Mesh, traced_under: AbstractMesh) -> Lowered:
        """The call traced under `traced_under`, its shardings checked against `mesh` (without
        the pipeline axis, when pipelined), and a pipeline's micro-batch traced too."""
        options = self._options
        in_specs = input_specs(options.in_shardings, call.args, call.kwargs)
        args, kwargs = call.args, call.kwargs
        if explicit(traced_under):
            args, kwargs, in_specs = typed(args, kwargs, in_specs, traced_under)
        graph, micro = self._traced(call, args, kwargs, traced_under)
        out_specs = output_specs(options.out_shardings, graph.out_tree)
        pipeline = options.build.pipeline
        split_over = mesh if pipeline is None else without_axis(mesh, pipeline.axis)
        user_shardings(graph, split_over.shape, in_specs, out_specs)
        donate = donated_leaves(self._fun, call, options.donate_argnums, options.donate_argnames)
        resident = resident_leaves(self._fun, call, options)
        build = dataclasses.replace(options.build, resident_inputs=resident)
        how = dataclasses.replace(options, build=build)
        return Lowered(graph, mesh, how, donate, in_specs, out_specs, micro)

    def _traced(
        self, call: Call, args: tuple, kwargs: dict, traced_under: AbstractMesh
    ) -> tuple[Graph, tuple[Graph, tuple[int, ...]] | None]:
        """The call's program (its arguments typed under Explicit axes) and, pipelined, its
        micro-batch's with the flat inputs that carry the batch (`microbatch`)."""
        graph = traced(call.fun, args, kwargs, traced_under)
        pipeline = self._options.build.pipeline
        micro = None if pipeline is None else micro_batch(call, pipeline, traced_under)
        return graph, micro

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
        call = self._call(args, kwargs)
        arguments = cache_key(call)
        if arguments is None:  # inside a jax transformation
            return self._as_nested_jit(args, kwargs)
        mesh, traced_under = self._mesh()
        key = (*arguments, mesh)
        compiled = self._cache.get(key)
        if compiled is None:
            compiled = self._cache[key] = self._lower(call, mesh, traced_under).compile()
        return compiled(*call.args, **call.kwargs)

    def _as_nested_jit(self, args: tuple, kwargs: dict) -> Any:
        """The call inside a jax transformation: the function traced into it as a nested
        `jax.jit` is, with a warning naming the user's line."""
        warnings.warn(
            f"{getattr(self._fun, '__name__', 'the function')} was called inside a jax "
            "transformation (jax.jit, grad, vmap, eval_shape...): there it runs as jax.jit, with "
            "jax's values and no IPU program; to simulate and cost it, apply ipujax.jit "
            "outside, e.g. ipujax.jit(jax.grad(f))",
            InsideJaxWarning,
            stacklevel=user_stacklevel(past=(str(Path(jax.__file__).parent),)),
        )
        static = self._options.static_argnums, self._options.static_argnames
        nested = jax.jit(self._fun, static_argnums=static[0], static_argnames=static[1])
        return nested(*args, **kwargs)


@dataclass
class _BoundJitted:
    """A jitted method bound to its instance, which becomes the first argument."""

    jitted: Jitted
    instance: Any = field(repr=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.jitted(self.instance, *args, **kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        return self.jitted.lower(self.instance, *args, **kwargs)


def jit(
    fun: Callable[..., Any] | None = None,
    *,
    mesh: Mesh | None = None,
    in_shardings: Any = None,
    out_shardings: Any = None,
    static_argnums: int | Sequence[int] = (),
    static_argnames: str | Sequence[str] = (),
    donate_argnums: int | Sequence[int] = (),
    donate_argnames: str | Sequence[str] = (),
    resident_argnums: int | Sequence[int] = (),
    resident_argnames: str | Sequence[str] = (),
    device_iterations: int = 1,
    phases: str | Sequence[str] | None = None,
    devices: Sequence[jax.Device] | None = None,
    replica_axes: str | Sequence[str] | None = None,
    collective_buffer_bytes: int = BUFFER_BYTES,
    pipeline: Pipeline | None = None,
    verify: bool | None = None,
    fuse: bool = True,
    numerics: str = "exact",
) -> Any:
    """Compiles `fun` for a virtual IPU system; use like `jax.jit`, with or without arguments.

    `mesh` is an ipujax or jax mesh; without one, a call runs on the mesh of the `with mesh:`
    block (or `jax.set_mesh`) it is traced in, else on one IPU.

    `phases`: None (one program on chip), "auto" (the program's blocks) or `jax.named_scope`
    names, weights in streaming memory; `pipeline` (an `ipujax.Pipeline`) puts stages on the
    IPUs along a mesh axis. `devices`: the real jax devices a mesh is spread over (default:
    all). `replica_axes`: the data-parallel axes (default: derived from the shardings).
    All-reduces that can run at one point run as one, up to `collective_buffer_bytes` (10 MiB,
    as Graphcore's CNN examples; 0 keeps them apart). docs/cli.md lists every keyword.
    `resident_argnums` / `resident_argnames` mark arguments (weights, a KV cache) that live on
    the IPUs between calls, never charged per call over the host link. `device_iterations` is
    how many calls' inputs one host transfer carries, as Poplar's (`CostReport.latency`).
    `fuse=False` costs each elementwise op alone, not chains as one map expression (`fusion`).
    `numerics="ipu"` rounds float16 results stochastically as the IPU does, with the key of a
    `with ipujax.numerics_key(key):` block (docs/target.md); "exact" is jax.jit's numbers.
    `verify=True` runs the partitioner's verifiers on what it builds (a debug aid; slower);
    None leaves it to the IPUJAX_VERIFY environment variable, read when `jit` is called."""
    options = JitOptions(
        mesh=None if mesh is None else as_mesh(mesh),
        traced_under=jax_twin(mesh),
        in_shardings=in_shardings,
        out_shardings=out_shardings,
        static_argnums=as_tuple(static_argnums),
        static_argnames=as_tuple(static_argnames),
        donate_argnums=as_tuple(donate_argnums),
        donate_argnames=as_tuple(donate_argnames),
        devices=None if devices is None else tuple(devices),
        build=build_options(phases, replica_axes, collective_buffer_bytes, pipeline, verify, fuse),
        resident_argnums=checked_argnums(resident_argnums),
        resident_argnames=checked_argnames(resident_argnames),
        numerics=checked_numerics(numerics),
        device_iterations=checked_iterations(device_iterations),
    )
    if fun is None:
        return lambda f: Jitted(f, options)
    if not callable(fun):
        raise ConfigError(f"ipujax.jit needs a callable, got {type(fun).__name__}")
    return Jitted(fun, options)

"""No mesh axis name is special: the replica (data-parallel) axes are derived from the shardings,
so a GPT step on a mesh named ("data", "model") costs exactly what it costs on ("dp", "tp"), and
`replica_axes=` overrides the derivation."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import pytest
from helpers import target
from jax.sharding import PartitionSpec as P

import ipujax

WORKLOADS = Path(__file__).resolve().parents[2] / "examples" / "gpt" / "workloads.py"
RENAME = {"dp": "data", "tp": "model"}


def _workloads() -> ModuleType:
    spec = importlib.util.spec_from_file_location("axis_names_workloads", WORKLOADS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _renamed_spec(spec: Any) -> Any:
    def axis(entry: Any) -> Any:
        if isinstance(entry, tuple):
            return tuple(RENAME.get(a, a) for a in entry)
        return RENAME.get(entry, entry)

    return P(*(None if e is None else axis(e) for e in spec))


def _renamed(specs: Any) -> Any:
    return jax.tree.map(
        lambda s: _renamed_spec(s) if isinstance(s, P) else s,
        specs,
        is_leaf=lambda s: isinstance(s, P) or s is None,
    )


@pytest.fixture(scope="module")
def tiny_gpt() -> tuple[Any, tuple, Any]:
    """The tiny GPT step with the specs examples/gpt derives for a ("dp", "tp") mesh."""
    mesh = ipujax.make_mesh((2, 2), ("dp", "tp"), target=target(64))
    fun, args, kwargs = _workloads().tiny(mesh)
    return fun, args, kwargs["in_shardings"]


def _report(tiny_gpt: Any, names: tuple[str, str], phases: Any) -> ipujax.CostReport:
    fun, args, specs = tiny_gpt
    mesh = ipujax.make_mesh((2, 2), names, target=target(64))
    if names != ("dp", "tp"):
        specs = _renamed(specs)
    compiled = ipujax.jit(fun, mesh=mesh, in_shardings=specs, phases=phases).lower(*args)
    return compiled.compile(check_memory_fits=False).cost_report()


def _with_names_swapped(report: ipujax.CostReport) -> str:
    """The report's JSON with the axis names dp and tp written as data and model."""
    text = report.to_json()
    return re.sub(r"\b(dp|tp)\b", lambda m: RENAME[m.group(1)], text)


@pytest.mark.parametrize("phases", [None, "auto"], ids=["unphased", "phased"])
def test_renamed_axes_cost_exactly_the_same(tiny_gpt: Any, phases: Any) -> None:
    usual = _report(tiny_gpt, ("dp", "tp"), phases)
    renamed = _report(tiny_gpt, ("data", "model"), phases)
    assert renamed.to_json() == _with_names_swapped(usual)
    assert json.loads(renamed.to_json()) != json.loads(usual.to_json())  # the names did change
    assert any(c.axes == ("data",) for c in renamed.collectives)  # the gradients' all-reduce
    if phases is not None:
        assert sum(p.link_bytes for p in renamed.phases) > 0  # replicated tensor sharding ran


def test_the_replica_axis_is_derived_whatever_its_name(tiny_gpt: Any) -> None:
    fun, args, specs = tiny_gpt
    mesh = ipujax.make_mesh((2, 2), ("data", "model"), target=target(64))
    compiled = ipujax.jit(fun, mesh=mesh, in_shardings=_renamed(specs)).lower(*args).compile()
    assert compiled.replica_axes == ("data",)
    assert "replica axes: data" in compiled.explain()


def _phased(fun: Any, args: tuple, specs: Any, **kwargs: Any) -> ipujax.Compiled:
    mesh = ipujax.make_mesh((2, 2), ("data", "model"), target=target(64))
    jitted = ipujax.jit(fun, mesh=mesh, in_shardings=_renamed(specs), phases="auto", **kwargs)
    return jitted.lower(*args).compile(check_memory_fits=False)


def test_replica_axes_override_the_derivation(tiny_gpt: Any) -> None:
    fun, args, specs = tiny_gpt
    derived = _phased(fun, args, specs)
    given = _phased(fun, args, specs, replica_axes="data")
    none = _phased(fun, args, specs, replica_axes=())
    assert given.replica_axes == ("data",) and none.replica_axes == ()
    assert given.cost_report() == derived.cost_report()
    # Over the replica axis the gradients are reduce-scattered and the optimizer updates
    # shards; without replicas they are all-reduced and every update is whole: more compute.
    # (Not necessarily more cycles: a tiny model's all-reduces, combined within their phases,
    # can cost less than its reduce-scatters, one ring each.)
    scattered = [c for c in derived.cost_report().collectives if c.kind == "reduce_scatter"]
    assert scattered and all(c.axes == ("data",) for c in scattered)
    assert not [c for c in none.cost_report().collectives if c.kind == "reduce_scatter"]
    compute = {
        name: report.time_split()["compute"]
        for name, report in (("none", none.cost_report()), ("derived", derived.cost_report()))
    }
    assert compute["none"] > compute["derived"]


def test_an_unknown_replica_axis_is_a_config_error(tiny_gpt: Any) -> None:
    fun, args, specs = tiny_gpt
    with pytest.raises(ipujax.ConfigError, match=r"replica_axes=\['dp'\].*'data', 'model'"):
        _phased(fun, args, specs, replica_axes=("dp",))

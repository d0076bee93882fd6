"""The plan search of `ipujax.planning` (docs/plan.md): the meshes it tries, the systems it knows,
its memory and cost bounds, its ranking, and whole searches over small steps on a Bow-2000 or
one IPU: data parallel by default, a user rule's tensor parallelism, depth extrapolation and
phases for inputs that outgrow the chip."""

from __future__ import annotations

import json
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_trees_close, layered_step, spec
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import ipujax
from ipujax.planning import (
    LAYOUTS,
    Candidate,
    InputBytes,
    Plan,
    data_parallel,
    memory_bound,
    meshes,
    plan,
    rank,
    samples_per_step,
    search,
    streaming_bound_seconds,
    system_ipus,
    workload_model,
)
from ipujax.planning.costing import _line
from partitioner import Target

BOW = Target.bow()
CHIP_BYTES = 1472 * 638_976  # docs/target.md: the Bow's tiles times 624 KiB
RTOL, ATOL = 2e-5, 2e-6


# ---- meshes and systems ----------------------------------------------------------------------


@given(st.integers(1, 64))
def test_meshes_cover_every_ipu_once_each(n: int) -> None:
    found = meshes(n)
    assert len(found) == len(set(found))
    assert (("dp", n),) in found
    for axes in found:
        names = [name for name, _ in axes]
        sizes = [size for _, size in axes]
        assert math.prod(sizes) == n
        assert all(size >= 2 for name, size in axes if name != "dp")
        # dp appears at size 1 only as the single-IPU mesh
        assert all(size >= 2 for name, size in axes if name == "dp") or axes == (("dp", 1),)
        # each is a layout's axes, in the layout's order, dp perhaps dropped
        assert any(names in (list(layout), list(layout[1:])) for layout in LAYOUTS)


def test_meshes_of_four_ipus() -> None:
    assert meshes(4) == [
        (("dp", 4),),
        (("tp", 4),),
        (("dp", 2), ("tp", 2)),
        (("tp1", 2), ("tp2", 2)),
        (("pp", 4),),
        (("dp", 2), ("pp", 2)),
        (("pp", 2), ("tp", 2)),
    ]


def test_meshes_of_one_and_a_prime() -> None:
    assert meshes(1) == [(("dp", 1),)]
    assert meshes(3) == [(("dp", 3),), (("tp", 3),), (("pp", 3),)]


@pytest.mark.parametrize(
    ("name", "ipus"),
    [("pod16", 16), ("pod256", 256), ("bow", 4), ("Pod-64", 64), ("8", 8), ("ipu", 1)],
)
def test_system_ipus(name: str, ipus: int) -> None:
    assert system_ipus(name) == ipus


@pytest.mark.parametrize("name", ["nonsense", "0", "pod-x"])
def test_unknown_system_names_the_choices(name: str) -> None:
    with pytest.raises(ipujax.ConfigError, match="unknown system") as error:
        system_ipus(name)
    for choice in ("pod16", "pod256", "bow", "ipu"):
        assert choice in str(error.value)


# ---- bounds --------------------------------------------------------------------------------------

PLAIN = Candidate((("dp", 1),))
PHASED = Candidate((("dp", 1),), phases="auto")


def test_the_chip_of_a_bow() -> None:
    assert BOW.tiles_per_ipu * BOW.bytes_per_tile == CHIP_BYTES
    assert BOW.streaming_bytes_per_ipu == 32 * 10**9
    assert BOW.streaming_bytes_per_second == 16e9


def test_memory_bound_without_phases() -> None:
    over = memory_bound(PLAIN, InputBytes(CHIP_BYTES + 1, 1000), BOW)
    assert over is not None and "over the chip" in over
    assert memory_bound(PLAIN, InputBytes(CHIP_BYTES - 1, CHIP_BYTES - 1), BOW) is None
    assert memory_bound(PLAIN, InputBytes(CHIP_BYTES, CHIP_BYTES), BOW) is None
    # the optimizer state off chip (a pipeline's): the inputs' total does not bound it
    assert memory_bound(PLAIN, InputBytes(10 * CHIP_BYTES, 1000, offchip=True), BOW) is None


def test_memory_bound_with_phases() -> None:
    largest = memory_bound(PHASED, InputBytes(CHIP_BYTES + 1, CHIP_BYTES + 1), BOW)
    assert largest is not None and "largest input" in largest
    # many inputs over the chip in all, each under it: phases may fit them
    assert memory_bound(PHASED, InputBytes(10 * CHIP_BYTES, CHIP_BYTES), BOW) is None
    streaming = memory_bound(PHASED, InputBytes(32e9 + 1, 1000), BOW)
    assert streaming is not None and "streaming memory" in streaming
    assert memory_bound(PHASED, InputBytes(32e9, CHIP_BYTES), BOW) is None


def test_streaming_bound_seconds() -> None:
    assert streaming_bound_seconds(InputBytes(8e9, 1.0), BOW) == 0.5
    total = 123_456_789.0
    assert streaming_bound_seconds(InputBytes(total, 1.0, samples=7), BOW) == total / 16e9


def test_line_through_two_depths() -> None:
    # a + (96 - 2) * (b - a) / (4 - 2) = a + 47 (b - a)
    assert _line(1.0, 3.0, 2, 4, 96) == 95.0
    assert _line(0.0938, 0.1657, 2, 4, 96) == pytest.approx(0.0938 + 47 * 0.0719)
    assert _line(5.0, 5.0, 2, 4, 96) == 5.0
    assert _line(1.0, 3.0, 2, 4, 2) == 1.0 and _line(1.0, 3.0, 2, 4, 4) == 3.0


def test_samples_per_step() -> None:
    w, x = np.zeros((3, 5), np.float32), np.zeros((8, 3), np.float32)
    assert samples_per_step((w, x), {}) == 8  # the last argument by default
    assert samples_per_step((w, x), {}, batch_argnums=(0,)) == 3
    pipeline = ipujax.Pipeline("pp", "auto", 2, batch_argnums=(0,))
    assert samples_per_step((w, x), {"pipeline": pipeline}) == 3
    assert samples_per_step(({"a": x}, w), {}, batch_argnums=(0,)) == 8


def test_data_parallel_rule() -> None:
    w, x = {"a": np.zeros((3, 5)), "b": np.zeros(5)}, np.zeros((8, 3))
    dp = ipujax.make_mesh((4,), ("dp",))
    assert data_parallel(dp, (w, x), (-1,)) == ({"a": P(), "b": P()}, P("dp"))
    one = ipujax.make_mesh((1,), ("dp",))
    assert data_parallel(one, (w, x), (-1,)) == ({"a": P(), "b": P()}, P())
    tp = ipujax.make_mesh((2, 2), ("dp", "tp"))
    with pytest.raises(ipujax.ConfigError, match="data parallel only"):
        data_parallel(tp, (w, x), (-1,))


# ---- ranking -------------------------------------------------------------------------------------


def _record(fits: bool, seconds: float, samples: int, dp: int = 1) -> Plan:
    return Plan(
        candidate=Candidate((("dp", dp),)),
        predicted_seconds=seconds,
        samples=samples,
        fits=fits,
        peak_tile_bytes=1000 if fits else 10**7,
        bytes_per_tile=638_976,
        collective_share=0.0,
        streaming_share=0.0,
        extrapolated=False,
    )


@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.floats(1e-6, 10.0, allow_nan=False),
            st.integers(1, 4096),
        ),
        max_size=12,
    )
)
def test_rank_fitting_first_then_fastest(records: list[tuple[bool, float, int]]) -> None:
    plans = [_record(f, s, n, dp=i + 1) for i, (f, s, n) in enumerate(records)]
    ranked = rank(plans)
    assert sorted(map(id, ranked)) == sorted(map(id, plans))
    fits = [p.fits for p in ranked]
    assert fits == sorted(fits, reverse=True)  # every fitting plan before any that does not
    for group in (True, False):
        rates = [p.samples_per_second for p in ranked if p.fits is group]
        assert rates == sorted(rates, reverse=True)


def test_samples_per_second() -> None:
    assert _record(True, 0.5, 8).samples_per_second == 16.0
    assert _record(True, 0.0, 8).samples_per_second == 0.0


# ---- fun mode: a small MLP's SGD step on a Bow-2000 --------------------------------------------


def _loss(w: dict[str, Any], x: Any) -> Any:
    h = jnp.tanh(x @ w["w1"])
    return jnp.mean((h @ w["w2"]) ** 2)


def _sgd_step(w: dict[str, Any], x: Any) -> dict[str, Any]:
    grads = jax.grad(_loss)(w, x)
    return jax.tree.map(lambda p, g: p - 0.1 * g, w, grads)


@pytest.fixture(scope="module")
def mlp() -> tuple[dict[str, np.ndarray], np.ndarray, Any]:
    rng = np.random.default_rng(0)
    w = {
        "w1": (0.1 * rng.standard_normal((16, 32))).astype(np.float32),
        "w2": (0.1 * rng.standard_normal((32, 8))).astype(np.float32),
    }
    x = rng.standard_normal((8, 16)).astype(np.float32)
    return w, x, jax.jit(_sgd_step)(w, x)


def test_default_rule_is_data_parallel(mlp: Any) -> None:
    w, x, expected = mlp
    notes: list[str] = []
    plans = plan(_sgd_step, w, x, system="bow", progress=notes.append)
    assert plans.ipus == 4 and plans.target == "bow"
    assert [p.mesh for p in plans.plans] == [{"dp": 4}]
    best = plans.best
    assert best.fits and not best.extrapolated and best.samples == 8
    assert best.predicted_seconds > 0
    # dp=4 alone: each pipelined mesh's first micro-batch count is refused for want of scopes
    # as its stages are read, before its stash is bounded or it is compiled
    assert plans.compiles == 1
    assert notes == ["costing dp=4"]

    reasons = {(tuple(s.candidate.axes), s.candidate.phases): s.reason for s in plans.skipped}
    # the phased variant of the mesh that fits is dominated
    assert reasons.pop(((("dp", 4),), "auto")) == "dominated"
    # every other mesh (tp, tp1 x tp2 and the pipelines) the default rule cannot shard
    assert {axes for axes, _ in reasons} == set(meshes(4)) - {(("dp", 4),)}
    assert set(reasons.values()) == {"not expressible"}
    for s in plans.skipped:
        if s.reason != "not expressible":
            continue
        # tensor-parallel axes the rule refuses; pipelines need the step's named scopes
        scopes = s.candidate.pipelined and "tp" not in s.candidate.mesh
        why = "named_scope" if scopes else "data parallel only"
        assert why in s.detail, s

    assert_trees_close(best.jit(_sgd_step)(w, x), expected, rtol=RTOL, atol=ATOL)


def _megatron_rule(mesh: ipujax.Mesh) -> tuple[Any, Any]:
    """w1 split by columns and w2 by rows over tp, the batch over dp; no other axis."""
    sizes = mesh.shape
    if set(sizes) - {"dp", "tp"}:
        raise ValueError(f"the MLP rule knows dp and tp, not {sorted(sizes)}")
    tp = "tp" if "tp" in sizes else None
    dp = "dp" if sizes.get("dp", 1) > 1 else None
    return {"w1": P(None, tp), "w2": P(tp, None)}, P(dp)


def test_a_user_rule_costs_tensor_parallel_plans(mlp: Any) -> None:
    w, x, expected = mlp
    plans = plan(_sgd_step, w, x, system="bow", rule=_megatron_rule)
    costed = [p.mesh for p in plans.plans]
    assert {"tp": 4} in costed and {"dp": 2, "tp": 2} in costed and {"dp": 4} in costed
    assert all(p.fits for p in plans.plans)
    refused = [s for s in plans.skipped if s.reason == "not expressible"]
    assert {tuple(s.candidate.axes) for s in refused} == {
        (("tp1", 2), ("tp2", 2)),
        (("pp", 4),),
        (("dp", 2), ("pp", 2)),
        (("pp", 2), ("tp", 2)),
    }
    assert all(s.detail.startswith("ValueError: the MLP rule knows") for s in refused)

    tp = next(p for p in plans.plans if p.mesh == {"tp": 4})
    assert tp.jit_kwargs["in_shardings"][0]["w1"] == P(None, "tp")
    assert_trees_close(tp.jit(_sgd_step)(w, x), expected, rtol=RTOL, atol=ATOL)
    hybrid = next(p for p in plans.plans if p.mesh == {"dp": 2, "tp": 2})
    assert_trees_close(hybrid.jit(_sgd_step)(w, x), expected, rtol=RTOL, atol=ATOL)


def test_a_batch_no_mesh_divides_leaves_no_plan(mlp: Any) -> None:
    w, _, _ = mlp
    x = np.zeros((6, 16), np.float32)  # 6 rows over dp=4
    plans = plan(_sgd_step, w, x, system="bow")
    assert plans.plans == ()
    with pytest.raises(ipujax.ConfigError, match="no plan for a bow"):
        _ = plans.best


def test_a_python_scalar_argument(mlp: Any) -> None:
    w, x, _ = mlp

    def step(w: Any, lr: Any, x: Any) -> Any:
        grads = jax.grad(_loss)(w, x)
        return jax.tree.map(lambda p, g: p - lr * g, w, grads)

    assert plan(step, w, 0.1, x, system="bow").best.mesh == {"dp": 4}


# ---- a layered workload: costed at 2 and 4 layers, extrapolated to its depth ------------------

D, BATCH = 32, 16


def _layered(mesh: Any = None, layers: int = 8) -> tuple:
    """An embedding, `layers` identical dense layers and a head, each under its own named
    scope; shapes only, the batch over dp."""

    step = layered_step()

    params = {
        "embed": spec((8, D)),
        "layers": [spec((D, D)) for _ in range(layers)],
        "head": spec((D, 4)),
    }
    x = spec((BATCH, 8))
    dp = "dp" if mesh is not None and mesh.shape.get("dp", 1) > 1 else None
    specs = jax.tree.map(lambda _: P(), params)
    return step, (params, x), {"in_shardings": (specs, P(dp))}


def _layered_model() -> Any:
    def call(mesh: Any, **extra: Any) -> tuple:
        return _layered(mesh=mesh, **extra)

    return workload_model(_layered, call)


@pytest.fixture(scope="module")
def whole_seconds() -> float:
    """The full-depth step compiled directly, cost-only."""
    fun, args, kwargs = _layered()
    mesh = ipujax.make_mesh((1,), ("dp",))
    lowered = ipujax.jit(fun, mesh=mesh, **kwargs).lower(*args)
    return lowered.compile(check_memory_fits=False).cost_report().seconds


def test_a_layered_workload_is_extrapolated(whole_seconds: float) -> None:
    model = _layered_model()
    assert model.depth == 8
    plans = search(model, "ipu", confirm=0)
    assert plans.compiles == 2  # at 2 and at 4 layers
    best = plans.best
    assert best.mesh == {"dp": 1} and best.extrapolated and best.fits
    assert best.predicted_seconds == pytest.approx(whole_seconds, rel=0.1)
    assert len(best.args[0]["layers"]) == 8  # the plan applies to the whole model
    assert [s.reason for s in plans.skipped] == ["dominated"]


def test_confirming_compiles_the_best_plan_whole(whole_seconds: float) -> None:
    plans = search(_layered_model(), "ipu", confirm=1)
    assert plans.compiles == 3
    best = plans.best
    assert not best.extrapolated
    assert best.predicted_seconds == pytest.approx(whole_seconds, rel=1e-9)


def test_a_shallow_factory_is_costed_whole() -> None:
    def shallow(mesh: Any = None, layers: int = 3) -> tuple:
        return _layered(mesh, layers)

    model = workload_model(shallow, lambda mesh, **extra: shallow(mesh=mesh, **extra))
    assert model.depth == 3
    plans = search(model, "ipu", confirm=0)
    assert plans.compiles == 1 and not plans.best.extrapolated


# ---- inputs over the chip: phases ----------------------------------------------------------------


def _big_step(ws: list[Any], x: Any) -> list[Any]:
    def loss(ws: list[Any]) -> Any:
        h = x
        for i, w in enumerate(ws):
            with jax.named_scope(f"layer{i}"):
                h = jnp.tanh(h @ w) if i % 2 == 0 else jnp.tanh(h @ w.T)
        return jnp.mean(h**2)

    grads = jax.grad(loss)(ws)
    return [w - 0.1 * g for w, g in zip(ws, grads, strict=True)]


def test_inputs_over_the_chip_need_phases() -> None:
    ws = [spec((8192, 9216)) for _ in range(4)]  # 302 MB each, 1.2 GB in all
    x = spec((8, 8192))
    total = 4 * 8192 * 9216 * 4
    assert total > CHIP_BYTES > total / 4

    plans = plan(_big_step, ws, x, system="ipu")
    plain = [s for s in plans.skipped if s.candidate == PLAIN]
    assert len(plain) == 1 and plain[0].reason == "memory bound"
    assert f"{total / 1e6:,.0f} MB" in plain[0].detail
    assert [p.candidate for p in plans.plans] == [PHASED]
    phased = plans.best
    assert phased.candidate.phases == "auto" and phased.jit_kwargs["phases"] == "auto"
    assert phased.predicted_seconds > streaming_bound_seconds(InputBytes(total, total / 4), BOW)
    assert phased.streaming_share > 0


# ---- JSON ----------------------------------------------------------------------------------------


def test_json(mlp: Any) -> None:
    w, x, _ = mlp
    plans = plan(_sgd_step, w, x, system="bow", rule=_megatron_rule)
    data = json.loads(plans.to_json())
    assert (data["system"], data["ipus"], data["target"]) == ("bow", 4, "bow")
    assert data["compiles"] == plans.compiles
    first = data["plans"][0]
    for key in ("mesh", "predicted_seconds", "fits", "peak_tile_bytes", "samples_per_second"):
        assert key in first
    assert first["rank"] == 1
    assert first["mesh"] == plans.best.mesh
    assert first["predicted_seconds"] == plans.best.predicted_seconds
    assert [p["rank"] for p in data["plans"]] == list(range(1, len(plans.plans) + 1))
    assert len(data["skipped"]) == len(plans.skipped)
    assert {s["reason"] for s in data["skipped"]} == {"dominated", "not expressible"}

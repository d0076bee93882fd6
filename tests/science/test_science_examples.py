"""examples/science/: the TLR-MVM real-time controller, the batched GEMM and the heat-equation
stencil, each run at a small size through its script (values checked against jax.jit by the
script, which fails with status 1 otherwise) and directly against jax.jit, their cost lines'
structure, their workloads through the cost-report CLI, and bad flags as one-line errors."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import EXAMPLES, assert_trees_close, load_example, target
from hypothesis import given, settings
from hypothesis import strategies as st

import ipujax

tlr = load_example("science", "tlr")
calls = load_example("science", "calls")
runner = load_example("science", "runner")
tlr_script = load_example("science", "tlr_mvm")
gemm_script = load_example("science", "batched_gemm")
stencil_script = load_example("science", "stencil")
workloads = load_example("science", "workloads")

SMALL = ["--tiles", "16"]  # a 16-tile Bow: every figure as the chip's, a few tiles of them
DURATION = r"[\d.]+(?:e[+-]\d+)? (?:us|ms)"


def _run(main, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


# ---- the TLR operator --------------------------------------------------------------------------


@settings(max_examples=10, deadline=None)
@given(
    rows=st.integers(1, 70),
    cols=st.integers(1, 90),
    tile=st.sampled_from([8, 16, 32]),
    seed=st.integers(0, 3),
)
def test_full_rank_tlr_is_the_dense_product(rows: int, cols: int, tile: int, seed: int) -> None:
    # At rank = tile size a tile's SVD keeps everything: the three phases compute A x exactly
    # (to f32 rounding), whatever the padding of M and N to whole tiles.
    shape = tlr.Shape(rows, cols, tile, tile)
    tiles = tlr.matrix_tiles(shape, seed)
    u, v = tlr.compress(tiles, shape.rank, seed)
    assert (u.shape, v.shape) == (shape.u_shape, shape.v_shape)
    x = tlr.padded(np.random.default_rng(seed).standard_normal(cols).astype(np.float32), shape)
    got = np.asarray(jax.jit(tlr.tlr_mvm)(u, v, x), np.float64)
    want = tlr.dense_product(tiles, x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_lower_rank_approximates_and_pads_with_zeros() -> None:
    shape = tlr.Shape(200, 500, 32, 6)
    tiles = tlr.matrix_tiles(shape)
    # Rows and columns past M and N are zero, so padding never leaks into the commands.
    assert not tiles.transpose(0, 2, 1, 3).reshape(shape.mt * 32, -1)[200:].any()
    u, v = tlr.compress(tiles, shape.rank)
    x = tlr.padded(np.random.default_rng(1).standard_normal(500).astype(np.float32), shape)
    exact = tlr.dense_product(tiles, x)
    error = np.linalg.norm(np.asarray(tlr.tlr_mvm(u, v, x)) - exact) / np.linalg.norm(exact)
    assert 0 < error < 0.1


def test_shape_figures() -> None:
    # MAVIS: 4,092 x 19,078 in tiles of 128 is 32 x 150 tiles (4,096 x 19,200 padded); U and V
    # of rank 16 in f32: 2 x 32 x 150 x 128 x 16 x 4 B = 78,643,200 B; two phases of
    # 32 x 150 x 128 x 16 multiply-adds, 2 FLOPs each: 39,321,600 FLOPs.
    shape = tlr.Shape(tlr.MAVIS_ACTUATORS, tlr.MAVIS_MEASUREMENTS)
    assert (shape.mt, shape.nt) == (32, 150)
    assert shape.operator_bytes(4) == 78_643_200
    assert shape.flops() == 39_321_600
    with pytest.raises(ValueError, match="rank 20 exceeds the tile size 16"):
        tlr.Shape(10, 10, 16, 20)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_tlr_mvm_through_ipujax_is_jax_jit(dtype: str) -> None:
    shape = tlr.Shape(100, 300, 32, 4)
    u, v = (b.astype(dtype) for b in tlr.compress(tlr.matrix_tiles(shape), shape.rank))
    x = tlr.padded(np.random.default_rng(2).standard_normal(300).astype(dtype), shape)
    mesh = ipujax.make_mesh((1,), ("ipu",), target=target(16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ipujax.HostBoundWarning)
        ours = ipujax.jit(tlr.tlr_mvm, mesh=mesh, resident_argnums=(0, 1))(u, v, x)
    tolerance = {"float32": 1e-5, "float16": 1e-2}[dtype]
    assert_trees_close(ours, jax.jit(tlr.tlr_mvm)(u, v, x), rtol=tolerance, atol=tolerance)


# ---- the scripts -------------------------------------------------------------------------------


def test_tlr_script(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--actuators", "200", "--measurements", "700", "--tile", "32", "--rank", "4"]
    code, out, err = _run(tlr_script.main, [*argv, "--frames", "2", *SMALL], capsys)
    assert code == 0, err
    assert "checked: 2 frames equal to jax.jit's commands" in out
    assert "7 x 22 tiles" in out  # ceil(200 / 32) x ceil(700 / 32)
    assert re.search(
        rf"per frame: {DURATION} latency = {DURATION} from the host \+ {DURATION} on the IPUs"
        rf" \+ {DURATION} back; [\d,]+ frames/s",
        out,
    )
    assert re.search(r"operator streamed at [\d.]+ (TB|GB)/s", out)
    assert re.search(r"jitter on the IPUs: 0 cycles \(every [\d,]+-cycle call", out)


def test_batched_gemm_script(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--batch", "8", "--m", "8", "--n", "16", "--k", "8", "--calls", "2", *SMALL]
    code, out, err = _run(gemm_script.main, [*argv, "--dtype", "float16"], capsys)
    assert code == 0, err
    assert "checked: 2 calls equal to jax.jit's products" in out
    assert "A resident on chip, B sent each call" in out
    assert re.search(r"on the IPU: [\d.]+ TFLOPS, \d+% of its [\d.]+ TFLOPS float16 peak", out)


def test_stencil_script(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--ipus", "2", "--grid", "32", "--steps", "4", *SMALL]
    code, out, err = _run(stencil_script.main, argv, capsys)
    assert code == 0, err
    assert "checked: 2 calls equal to jax.jit's field" in out
    # A 32-column f32 row is 128 B; one row each way per step: 256 B per IPU.
    assert "per step 1 halo exchange(s), 256 B per IPU" in out
    assert re.search(rf"on one IPU: {DURATION} per step; 2 IPUs are [\d.]+x as fast", out)


def test_the_solver_returns_its_field_and_last_change() -> None:
    u = np.random.default_rng(0).random((16, 16), dtype=np.float32)
    field, change = stencil_script.solver(3)(u)
    two = stencil_script.solver(2)(u)[0]
    np.testing.assert_allclose(field, stencil_script.heat_step(two), rtol=1e-6)
    np.testing.assert_allclose(change, np.abs(field - two).max(), rtol=1e-6)


@pytest.mark.parametrize(
    ("main", "argv", "message"),
    [
        (tlr_script.main, ["--tile", "16", "--rank", "32"], "rank 32 exceeds the tile size 16"),
        (stencil_script.main, ["--ipus", "4", "--grid", "8"], "--grid 8 is too small for 4"),
    ],
)
def test_bad_flags_are_one_line(main, argv, message, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(main, argv, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err


def test_a_failed_check_is_status_1(capsys: pytest.CaptureFixture[str]) -> None:
    # Values off by more than the tolerance fail the check, which a script reports in one
    # line with status 1.
    assert runner.check([np.ones(3)], [np.ones(3) + 1e-7], 1e-5, 1e-6) == pytest.approx(1e-7)
    with pytest.raises(runner.CheckError, match=r"differs from jax\.jit by up to 0\.5"):
        runner.check([np.ones(3)], [np.full(3, 1.5)], 1e-5, 1e-6)

    def main(args: object) -> int:
        runner.check(np.zeros(2), np.ones(2), 1e-5, 1e-6)
        return 0

    code = runner.run(main, runner.parser("x.py", "A script."), [])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("x.py: error: check against jax.jit failed")


# ---- the cost of a call ------------------------------------------------------------------------


def test_a_calls_parts_add_up_to_the_report() -> None:
    fun, args, kwargs = workloads.tlr_mvm(shape=tlr.Shape(100, 300, 32, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ipujax.HostBoundWarning)
        report = ipujax.jit(fun, **kwargs).lower(*args).compile().cost_report()
    call = calls.CallCost.of(report)
    assert call.latency == pytest.approx(report.seconds)
    assert call.per_second == pytest.approx(1 / report.seconds)
    device = sum(s.cycles for s in report.supersteps if s.kind != "host")
    assert call.device_cycles == device and call.host_in > 0 and call.host_out > 0


# ---- the workloads, through the CLI ------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "flags", "host_bytes"),
    [
        # The padded measurements in, 19,200 x 4 B, and the commands out, 4,096 x 4 B.
        ("tlr_mvm", [], 19_200 * 4 + 4_096 * 4),
        ("tlr_mvm_fp16", [], (19_200 + 4_096) * 2),
        # B in and C out, each 1,472 x 64 x 64 x 4 B.
        ("batched_gemm", [], 2 * 1_472 * 64 * 64 * 4),
        # The field stays on the IPUs (its step returns it updated): only the f32 change
        # goes home, from each of the 2 IPUs.
        ("heat", ["--mesh", "x=2"], 2 * 4),
    ],
)
def test_workloads_cost_through_the_cli(
    name: str, flags: list[str], host_bytes: int, tmp_path: Path
) -> None:
    from ipujax.cli import main

    spec = f"{EXAMPLES / 'science' / 'workloads.py'}:{name}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ipujax.HostBoundWarning)
        assert main(["cost-report", spec, *flags, "--json", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["host_bytes"] == host_bytes

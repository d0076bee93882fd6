"""train.py, run in-process through `main(argv)` at tiny sizes: --check on the Megatron 1D and
PopXL 2D meshes, phased execution, checkpoints and a bit-identical resume, reports and plots."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import printed_losses, run_train, skew_reference, usage_error


@pytest.mark.parametrize("mesh", ["dp=2,tp=2", "dp=2,tp1=2,tp2=2"], ids=["megatron-1d", "2d"])
def test_check_passes(
    gpt: SimpleNamespace, mesh: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "step.json"
    assert run_train(gpt, "--mesh", mesh, "--steps", "3", "--check", "--report", str(report)) == 0
    out = capsys.readouterr().out
    assert "check passed: 3 steps" in out
    assert len(printed_losses(out)) >= 2 and all(np.isfinite(printed_losses(out)))
    data = json.loads(report.read_text())
    assert data["total_cycles"] > 0
    axes = {tuple(c["axes"]) for c in data["collectives"]}
    wanted = {("tp",), ("dp",)} if "tp=" in mesh else {("tp1",), ("tp2",), ("dp",)}
    assert wanted <= axes
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_check_fails_when_jax_jit_disagrees(
    gpt: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    skew_reference(monkeypatch, gpt.train, lambda out: (None, None, out[2] * 1.001))
    assert run_train(gpt, "--mesh", "dp=2,tp=2", "--steps", "3", "--check") == 1
    assert "check failed at step 1" in capsys.readouterr().err


@pytest.mark.parametrize("mesh", ["dp=2,tp=2", "dp=2,tp1=2,tp2=2"], ids=["megatron-1d", "2d"])
@pytest.mark.parametrize("micro_batches", [1, 2])
def test_phases_by_layer_with_gradient_accumulation(
    gpt: SimpleNamespace,
    tmp_path: Path,
    mesh: str,
    micro_batches: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = tmp_path / "phased.json"
    flags = ["--layers", "2", "--mesh", mesh, "--phases", "layer", "--steps", "2"]
    flags += ["--grad-accumulation", str(micro_batches)]
    assert run_train(gpt, *flags, "--check", "--report", str(report)) == 0
    assert "check passed: 2 steps" in capsys.readouterr().out
    phases = [p["name"] for p in json.loads(report.read_text())["phases"]]
    # A forward and a backward phase per layer, whatever the number of micro-batches (they
    # run phase-major); the global-norm clip adds layer 1's optimizer phase (or two rounds of
    # them, where the gradients are whole only after the loop: their norm, then the update).
    for layer in ("layer0", "layer1"):
        assert layer in phases and f"{layer} (backward)" in phases
    assert [p for p in phases if p.startswith("layer1 (optimizer")], phases


def test_micro_batches_must_split_the_batch(
    gpt: SimpleNamespace, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_train(gpt, "--mesh", "dp=2", "--grad-accumulation", "3", "--steps", "1") == 2
    assert "does not split into 3 micro-batches over dp=2" in capsys.readouterr().err


def saved(folder: Path) -> dict[str, np.ndarray]:
    with np.load(folder / "checkpoint.npz") as data:
        return {key: data[key] for key in data.files}


def test_resume_is_bit_identical(gpt: SimpleNamespace, tmp_path: Path) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert run_train(gpt, "--steps", "6", "--checkpoint", str(straight)) == 0
    assert run_train(gpt, "--steps", "3", "--checkpoint", str(resumed)) == 0
    assert saved(resumed)["step"] == 3
    gpt.train._COMPILED.clear()  # compile again, as a new process would
    assert run_train(gpt, "--steps", "6", "--checkpoint", str(resumed), "--resume") == 0
    a, b = saved(straight), saved(resumed)
    assert a.keys() == b.keys()
    assert any(key.startswith("params[") for key in a)
    assert any(key.startswith("opt_state") for key in a)
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        assert a[key].tobytes() == b[key].tobytes(), key  # bitwise, losses and RNG included


def test_resume_refuses_other_settings(
    gpt: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "ckpt"
    assert run_train(gpt, "--steps", "1", "--checkpoint", str(folder)) == 0
    capsys.readouterr()
    flags = ("--steps", "2", "--checkpoint", str(folder), "--resume", "--lr", "0.5")
    assert "--lr" in usage_error(run_train(gpt, *flags), capsys)


def test_plot_is_a_png(gpt: SimpleNamespace, tmp_path: Path) -> None:
    plot = tmp_path / "loss.png"
    assert run_train(gpt, "--steps", "2", "--plot", str(plot)) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--mesh", "dp2"], "--mesh"),
        (["--mesh", "dp=2,tp=3"], "heads"),
        (["--mesh", "dp=512"], "ConfigError"),
        (["--resume"], "--checkpoint"),
    ],
)
def test_user_errors_are_one_line(
    gpt: SimpleNamespace, flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in usage_error(run_train(gpt, "--steps", "1", *flags), capsys)


def test_stdlib_text_is_the_default_data(gpt: SimpleNamespace) -> None:
    data, where = gpt.train.load_corpus(None)
    assert "standard library" in where and data.size > 1_000_000
    assert b"def " in data[:100_000].tobytes()
    rng = np.random.default_rng(0)
    batch = gpt.train.sample_batch(data, rng, 4, 16)
    assert batch.shape == (4, 17) and batch.dtype == np.int32 and batch.max() < 256


def test_pipelined_check_passes(
    gpt: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--pipeline on dp=2 x pp=2: 2 stages of the tiny GPT's blocks, 2 micro-batches, every
    step's loss jax.jit's; the report has the two stages."""
    report = tmp_path / "step.json"
    flags = ("--mesh", "dp=2,pp=2", "--pipeline", "--microbatches", "2", "--steps", "2")
    assert run_train(gpt, *flags, "--check", "--report", str(report)) == 0
    assert "check passed: 2 steps" in capsys.readouterr().out
    data = json.loads(report.read_text())
    assert len(data["stages"]) == 2 and data["microbatches"] == 2


def test_pipeline_needs_a_pp_axis(gpt: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_train(gpt, "--mesh", "dp=2", "--pipeline", "--steps", "1") == 2
    assert "--pipeline needs a mesh axis named pp" in capsys.readouterr().err

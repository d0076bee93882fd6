"""train.py, run in-process through `main(argv)` at small sizes: --check on a data-parallel
mesh of 4 IPUs with the loss falling, the check's failure, the synthetic data and user errors."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import printed_losses, run_train, skew_reference, usage_error


@pytest.mark.multi_ipu
def test_check_passes_and_loss_falls_on_dp4(
    resnet: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "step.json"
    flags = ["--mesh", "dp=4", "--batch", "16", "--steps", "10", "--log-every", "1"]
    assert run_train(resnet, *flags, "--check", "--report", str(report)) == 0
    out = capsys.readouterr().out
    assert "check passed: 10 steps" in out
    curve = printed_losses(out)
    assert len(curve) == 10 and all(np.isfinite(curve))
    assert np.mean(curve[-3:]) < curve[0] - 0.2, curve
    data = json.loads(report.read_text())
    assert data["total_cycles"] > 0 and data["ipus"] == 4
    assert {tuple(c["axes"]) for c in data["collectives"]} == {("dp",)}  # batch norm, gradients


@pytest.mark.multi_ipu
@pytest.mark.parametrize("optimizer", ["lars", "lamb"])
def test_check_passes_with_lars_and_lamb(
    resnet: SimpleNamespace, optimizer: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--mesh", "dp=4", "--batch", "8", "--steps", "2", "--optimizer", optimizer]
    assert run_train(resnet, *flags, "--check") == 0
    assert "check passed: 2 steps" in capsys.readouterr().out


def test_one_ipu_check_passes(resnet: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_train(resnet, "--mesh", "dp=1", "--batch", "4", "--steps", "2", "--check") == 0
    out = capsys.readouterr().out
    assert "check passed: 2 steps" in out and "on 1 mk2 IPU(s)" in out


@pytest.mark.parametrize(
    ("skew", "message"),
    [("loss", "ipujax loss"), ("params", "params['head']['b'] differs from jax.jit's")],
)
def test_check_fails_when_jax_jit_disagrees(
    resnet: SimpleNamespace,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    skew: str,
    message: str,
) -> None:

    def wrong(out: tuple) -> tuple:
        params, bn_state, opt_state, loss = out
        if skew == "loss":
            return params, bn_state, opt_state, loss * 1.001
        head = {**params["head"], "b": params["head"]["b"] + 0.1}  # a different update
        return {**params, "head": head}, bn_state, opt_state, loss

    skew_reference(monkeypatch, resnet.train, wrong)
    assert run_train(resnet, "--mesh", "dp=1", "--batch", "4", "--steps", "2", "--check") == 1
    err = capsys.readouterr().err
    assert "check failed at step 1" in err and message in err


def test_synthetic_data(resnet: SimpleNamespace) -> None:
    config = resnet.model.small_config()
    patterns = resnet.train.class_patterns(config, 0)
    assert patterns.shape == (10, 32, 32, 3) and patterns.dtype == np.float32
    images, labels = resnet.train.sample_batch(patterns, np.random.default_rng(0), 6)
    assert images.shape == (6, 32, 32, 3) and images.dtype == np.float32
    assert labels.shape == (6,) and labels.dtype == np.int32 and labels.max() < 10
    again = resnet.train.class_patterns(config, 0)
    assert np.array_equal(patterns, again)  # the same classes every run


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--mesh", "dp4"], "--mesh"),
        (["--mesh", "dp=2,tp=2"], "not ResNet axes"),
        (["--mesh", "dp=4", "--batch", "6"], "does not split over dp=4"),
        (["--mesh", "dp=512"], "ConfigError"),
    ],
)
def test_user_errors_are_one_line(
    resnet: SimpleNamespace, flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in usage_error(run_train(resnet, "--steps", "1", *flags), capsys)

"""generate.py prints text sampled from a checkpoint of train.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest


@pytest.fixture(scope="module")
def checkpoint(gpt: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gpt") / "ckpt"
    assert gpt.train.main([*gpt.tiny, "--steps", "2", "--checkpoint", str(folder)]) == 0
    return folder


@pytest.mark.parametrize("engine", [[], ["--jax"]], ids=["ipujax", "jax.jit"])
def test_generate_prints_text(
    gpt: SimpleNamespace, checkpoint: Path, engine: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    argv = ["--checkpoint", str(checkpoint), "--prompt", "def ", "--tokens", "24", *engine]
    assert gpt.generate.main([*argv, "--tiles", "64"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("def ")
    assert len(captured.out.rstrip("\n").encode("utf-8", "replace")) >= 4 + 1
    assert "checkpoint step 2" in captured.err


def test_ipujax_forward_equals_jax_jit(gpt: SimpleNamespace, checkpoint: Path) -> None:
    saved = gpt.train.load_checkpoint(str(checkpoint))
    window = np.arange(saved["config"].seq, dtype=np.int32)[None] % 256
    ours = gpt.generate.make_forward(False, "bow", 64)(saved["params"], window)
    want = gpt.generate.make_forward(True, "bow")(saved["params"], window)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(want), rtol=1e-5, atol=1e-5)
    assert np.asarray(ours).shape == (saved["config"].seq, 256)
    assert jax.tree.structure(saved["params"]) is not None


def test_missing_checkpoint_is_an_error(
    gpt: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gpt.generate.main(["--checkpoint", str(tmp_path / "none")]) == 2
    assert "no checkpoint" in capsys.readouterr().err

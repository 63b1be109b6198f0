"""`python -m trainer.bench` argument checks: bad modes fail at once, with the flag and the fix, before any GPU work."""

from __future__ import annotations

import pytest
import torch

from trainer.bench.__main__ import main, parse_mode
from trainer.errors import ConfigError


def test_parse_mode_splits_precision_and_options():
    assert parse_mode("bf16_params+compile+compile_decode", "--grpo-modes", {"compile", "compile_decode"}) == (
        "bf16_params", ["compile", "compile_decode"])
    assert parse_mode("bf16", "--train-modes", {"compile"}) == ("bf16", [])


@pytest.mark.parametrize("argv, flag", [
    (["train", "--train-modes", "fp8"], "--train-modes"),
    (["train", "--train-modes", "bf16+compile_decode"], "--train-modes"),  # decode option is not a training option
    (["grpo", "--grpo-modes", "bf16,bf16_params+cuda_graphs"], "--grpo-modes"),
    (["rollout", "--decode-modes", "eager,graph"], "--decode-modes"),
])
def test_bad_mode_names_the_flag(argv, flag, tmp_path):
    with pytest.raises(ConfigError) as e:
        main(argv + ["--out", str(tmp_path / "bench")])
    msg = str(e.value)
    assert flag in msg and "fix:" in msg and "\n" not in msg
    assert not (tmp_path / "bench").exists()  # nothing written before the check


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_valid_modes_on_cpu_ask_for_a_gpu(tmp_path):
    with pytest.raises(ConfigError, match="needs a CUDA or ROCm device"):
        main(["grpo", "--grpo-modes", "bf16,bf16_params+compile+compile_decode", "--out", str(tmp_path)])

"""`actor.strategy` is honoured or the run stops at start: never a silent FSDP2 fallback."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.helpers.configs import tiny_config
from trainer.backends.strategy import check_strategy, megatron_missing, model_type
from trainer.config import load_config
from trainer.errors import ConfigError

HAS_MEGATRON = megatron_missing() is None


def _cfg(tmp_path: Path, **actor):
    return load_config(tiny_config(str(tmp_path / "run"), actor=actor))


def test_fsdp2_default_passes(tmp_path):
    check_strategy(_cfg(tmp_path))


def test_fsdp2_with_megatron_parallelism_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"actor\.megatron\.tensor_model_parallel_size=2: .*actor\.strategy=fsdp2"):
        check_strategy(_cfg(tmp_path, megatron={"tensor_model_parallel_size": 2}))


@pytest.mark.skipif(HAS_MEGATRON, reason="megatron-core and mbridge are installed")
def test_megatron_without_package_stops_at_start_cli(tmp_path, capsys):
    from trainer.__main__ import main

    out = tmp_path / "run"
    cfg_file = tmp_path / "c.yaml"
    import yaml

    cfg_file.write_text(yaml.safe_dump(tiny_config(str(out), actor={"strategy": "megatron"})))
    assert main([str(cfg_file)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "actor.strategy=megatron" in err and "rlbench[megatron]" in err and "is not installed" in err
    assert not out.exists()  # stopped before anything was written or loaded


@pytest.mark.skipif(not HAS_MEGATRON, reason="needs megatron-core and mbridge (pip install 'rlbench[megatron]')")
def test_megatron_unmappable_model_type(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=32, n_head=2).save_pretrained(tmp_path / "gpt2")
    cfg = load_config(tiny_config(str(tmp_path / "run"), model={"path": str(tmp_path / "gpt2")},
                                  actor={"strategy": "megatron"}))
    with pytest.raises(ConfigError, match=r"actor\.strategy=megatron: model\.path=.* is a 'gpt2' model, which the "
                                          r"mbridge bridge cannot map \(fix: use one of .*llama.*\)"):
        check_strategy(cfg)


def test_model_type_forms(tmp_path):
    assert model_type(_cfg(tmp_path).model) == "qwen2"
    assert model_type(load_config({"model": {"path": "embedded:smollm2-135m-instruct"}}).model) == "llama"
    assert model_type(load_config({"model": {"path": "shape:qwen3-8b"}}).model) == "qwen3"
    assert importlib.util.find_spec("trainer.backends.megatron") is not None


@pytest.mark.skipif(not HAS_MEGATRON, reason="needs megatron-core and mbridge (pip install 'rlbench[megatron]')")
def test_megatron_unsupported_settings_stop_at_start(tmp_path):
    base = {"strategy": "megatron"}
    for extra, match in (({"moe_aux_loss_coeff": 0.01}, r"actor.moe_aux_loss_coeff=0.01: .*fix: set it to 0"),
                         ({"megatron": {"pipeline_model_parallel_size": 2}}, r"pipeline_model_parallel_size=2"),
                         ({"use_kl_loss": True}, r"actor.use_kl_loss: the reference policy")):
        with pytest.raises(ConfigError, match=match):
            check_strategy(_cfg(tmp_path, **base, **extra))
    check_strategy(_cfg(tmp_path, **base))  # the single-process colocated run is accepted

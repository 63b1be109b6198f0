"""`actor.strategy` is honoured or the run stops at start: never a silent FSDP2 fallback."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.helpers.configs import tiny_config
from trainer.backends.strategy import check_strategy, megatron_missing, model_type, num_experts
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
    assert num_experts(_cfg(tmp_path).model) == 0
    assert num_experts(load_config({"model": {"path": "tiny:qwen3_moe"}}).model) == 4
    assert num_experts(load_config({"model": {"path": "tiny:mixtral"}}).model) == 4
    assert num_experts(load_config({"model": {"path": "embedded:smollm2-135m-instruct", "upcycle_num_experts": 8}}
                                   ).model) == 8
    assert importlib.util.find_spec("trainer.backends.megatron.backend") is not None


NEEDS_MEGATRON = pytest.mark.skipif(not HAS_MEGATRON, reason="needs megatron-core and mbridge (pip install 'rlbench[megatron]')")
RAY2 = {"use_ray": True, "n_gpus_per_node": 2}


def _meg(tmp_path: Path, *, model: str = "tiny:qwen3", trainer: dict | None = None, **actor):
    sections = {"model": {"path": model}, "actor": {"strategy": "megatron", **actor}, "trainer": trainer or {}}
    return load_config(tiny_config(str(tmp_path / "run"), **sections))


@NEEDS_MEGATRON
@pytest.mark.parametrize(("kw", "match"), [
    ({"megatron": {"pipeline_model_parallel_size": 2}},
     r"^actor\.megatron\.pipeline_model_parallel_size=2: the single-process loop has one rank"),
    ({"megatron": {"pipeline_model_parallel_size": 2, "optimizer": "megatron"}, "trainer": RAY2},
     r"^actor\.megatron\.pipeline_model_parallel_size=2: pipeline parallelism is not built with megatron's DDP"),
    ({"megatron": {"sequence_parallel": True}, "trainer": RAY2},
     r"^actor\.megatron\.sequence_parallel=true: .* and actor\.megatron\.tensor_model_parallel_size=1 \(fix"),
    ({"use_kl_loss": True, "megatron": {"pipeline_model_parallel_size": 2}, "trainer": RAY2},
     r"^actor\.use_kl_loss: the KL loss's reference policy is not built under pipeline parallelism"),
    ({"megatron": {"tensor_model_parallel_size": 2}}, (r"^actor\.megatron\.tensor_model_parallel_size=2 / .*the "
                                                        r"single-process loop has one rank")),
    ({"megatron": {"tensor_model_parallel_size": 2}, "trainer": {**RAY2, "n_gpus_per_node": 3}},
     r"^actor\.megatron\.tensor_model_parallel_size=2: does not divide the 3 trainer ranks"),
    ({"megatron": {"expert_model_parallel_size": 2}, "trainer": RAY2},
     r"^actor\.megatron\.expert_model_parallel_size=2: .*is a dense model"),
    ({"megatron": {"expert_model_parallel_size": 3}, "trainer": {**RAY2, "n_gpus_per_node": 3},
      "model": "tiny:qwen3_moe"}, r"^actor\.megatron\.expert_model_parallel_size=3: does not divide the model's 4 "),
    ({"megatron": {"tensor_model_parallel_size": 2}, "trainer": RAY2, "model": "tiny:qwen3_moe"},
     r"^actor\.megatron\.tensor_model_parallel_size=2: an MoE model under tensor parallelism needs sequence"),
    ({"megatron": {"tensor_model_parallel_size": 2}, "trainer": {"mode": "fully_async"}},
     r"^actor\.megatron\.tensor_model_parallel_size=2: does not divide the 1 trainer ranks \(async\.train_gpus\)"),
    ({"model": "tiny:qwen2.5-vl"}, r"^actor\.strategy=megatron: model\.path=tiny:qwen2\.5-vl is a vision-language "
                                   r"model, and the Megatron backend builds no vision tower"),
])
def test_megatron_unbuilt_settings_stop_at_start(tmp_path, kw, match):
    with pytest.raises(ConfigError, match=match) as e:
        check_strategy(_meg(tmp_path, **kw))
    assert "\n" not in str(e.value) and "(fix: " in str(e.value)


@NEEDS_MEGATRON
def test_megatron_layouts_that_run_are_accepted(tmp_path):
    check_strategy(_meg(tmp_path))  # the single-process colocated loop
    check_strategy(_meg(tmp_path, trainer=RAY2))  # colocated on Ray, DP=2
    check_strategy(_meg(tmp_path, trainer=RAY2, megatron={"tensor_model_parallel_size": 2}))  # TP=2
    check_strategy(_meg(tmp_path, trainer=RAY2, megatron={"tensor_model_parallel_size": 2, "sequence_parallel": True}))
    check_strategy(_meg(tmp_path, trainer=RAY2, model="tiny:qwen3_moe", megatron={  # MoE under TP: SP, EP folded in
        "tensor_model_parallel_size": 2, "sequence_parallel": True, "expert_model_parallel_size": 2}))
    check_strategy(_meg(tmp_path, model="tiny:qwen3_moe", moe_aux_loss_coeff=0.01))  # megatron's aux loss
    check_strategy(_meg(tmp_path, trainer=RAY2, model="tiny:qwen3_moe", megatron={"expert_model_parallel_size": 2}))
    upcycled = _meg(tmp_path, trainer=RAY2, model="tiny:llama", megatron={"expert_model_parallel_size": 2})
    check_strategy(upcycled.model_copy(update={"model": upcycled.model.model_copy(update={"upcycle_num_experts": 4})}))
    cfg = _meg(tmp_path, trainer={"mode": "fully_async"}, megatron={"tensor_model_parallel_size": 2})
    check_strategy(cfg.model_copy(update={"async_": cfg.async_.model_copy(update={"train_gpus": 2})}))
    for engine in ("vllm", "sglang"):  # the export feeds every engine (tests/engines/test_vllm_megatron.py)
        cfg = _meg(tmp_path, model="tiny:mixtral")
        check_strategy(cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"engine": engine})}))

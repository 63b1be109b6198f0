"""Model loading: tiny models of the real architectures, dummy shapes, and one-line errors."""

from __future__ import annotations

import pytest
import torch

from trainer.config import ModelConfig
from trainer.errors import ModelError
from trainer.models.loading import load_model_and_tokenizer
from trainer.models.specs import SHAPES, eos_token_ids


@pytest.mark.parametrize("arch,cls", [("qwen2", "Qwen2ForCausalLM"), ("qwen3", "Qwen3ForCausalLM"),
                                      ("llama", "LlamaForCausalLM")])
def test_tiny_models_are_the_real_architectures(arch, cls):
    model, tok = load_model_and_tokenizer(ModelConfig(path=f"tiny:{arch}"))
    assert type(model).__name__ == cls
    assert model.config.vocab_size == len(tok)
    assert tok.pad_token_id is not None and eos_token_ids(tok, model)
    ids = torch.tensor([tok.encode("What is 3 + 5?")])
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], len(tok))


def test_tiny_models_are_seeded():
    a, _ = load_model_and_tokenizer(ModelConfig(path="tiny:qwen2"), seed=1)
    b, _ = load_model_and_tokenizer(ModelConfig(path="tiny:qwen2"), seed=1)
    c, _ = load_model_and_tokenizer(ModelConfig(path="tiny:qwen2"), seed=2)
    pa, pb, pc = (next(m.parameters()) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_shape_configs_match_the_public_models():
    cls, kw = SHAPES["qwen2.5-0.5b"]
    cfg = cls(**kw)
    # Qwen2.5-0.5B: 494M parameters with tied embeddings
    n = cfg.vocab_size * cfg.hidden_size + cfg.num_hidden_layers * (
        cfg.hidden_size * (cfg.hidden_size + 2 * cfg.num_key_value_heads * cfg.hidden_size // cfg.num_attention_heads
                           + cfg.hidden_size) + 3 * cfg.hidden_size * cfg.intermediate_size)
    assert 480e6 < n < 500e6


def test_bf16_dtype():
    model, _ = load_model_and_tokenizer(ModelConfig(path="tiny:llama", dtype="bfloat16"))
    assert next(model.parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize("path,needle", [("/nonexistent/model", "does not exist"), ("tiny:gpt5", "tiny:qwen2"),
                                         ("shape:qwen9", "shape:qwen2.5-0.5b"), ("embedded:nope", "embedded:smollm2")])
def test_bad_model_paths_are_one_line_errors(path, needle):
    with pytest.raises(ModelError) as e:
        load_model_and_tokenizer(ModelConfig(path=path))
    msg = str(e.value)
    assert "model.path" in msg and needle in msg and "\n" not in msg


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelError, match="no config.json"):
        load_model_and_tokenizer(ModelConfig(path=str(tmp_path)))


def test_local_hf_folder_roundtrip(tmp_path):
    model, tok = load_model_and_tokenizer(ModelConfig(path="tiny:qwen2"))
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again, tok2 = load_model_and_tokenizer(ModelConfig(path=str(tmp_path)))
    assert torch.equal(next(again.parameters()), next(model.parameters()))
    dummy, _ = load_model_and_tokenizer(ModelConfig(path=str(tmp_path), load_format="dummy"), seed=5)
    assert not torch.equal(next(dummy.parameters()), next(model.parameters()))


def test_override_config_reaches_a_pretrained_folder(tmp_path):
    model, tok = load_model_and_tokenizer(ModelConfig(path="tiny:qwen2"))
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    before = model.config.max_position_embeddings
    again, _ = load_model_and_tokenizer(ModelConfig(path=str(tmp_path),
                                                    override_config={"max_position_embeddings": 4 * before}))
    assert again.config.max_position_embeddings == 4 * before
    assert torch.equal(next(again.parameters()), next(model.parameters()))


def test_override_config_on_the_embedded_model_is_an_error():
    with pytest.raises(ModelError, match="model.override_config"):
        load_model_and_tokenizer(ModelConfig(path="embedded:smollm2-135m-instruct",
                                             override_config={"max_position_embeddings": 4096}))

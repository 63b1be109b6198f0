"""`actor.lm_head_compile`: the LM-head chunk math compiled alone, on both backends' actors.

- which backend the setting resolves to (auto: on for CUDA devices, off elsewhere; `off` with
  `actor.compile` is a ConfigError, since `actor.compile` compiles the head too);
- on a tiny Qwen3-MoE (4 experts, top-2, router statistics on) in fp32 on CPU, one `Actor.update` with the
  compiled head gives the eager head's metrics within 1e-5 relative, and its gradients (recorded before the
  optimizer step) within 1e-5 relative per tensor: the chunk math is the same, only summation order and the
  padded last chunk differ. `aot_eager` (dynamo + AOTAutograd, no code generation) keeps it fast on CPU; the
  inductor-compiled chunks are compared with eager in tests/unit/test_actor_compile.py (slow tier) and on the
  GPU by tools/sm90/lm_head_bench.py.
"""

from __future__ import annotations

import pytest
import torch

from trainer.backends.actor import Actor, lm_head_compile_backend
from trainer.config import ActorConfig, ModelConfig
from trainer.errors import ConfigError
from trainer.models.loading import load_model_and_tokenizer

R = 20


@pytest.mark.parametrize(("mode", "device", "compile", "want"), [
    ("auto", "cpu", False, None), ("auto", "cuda", False, "inductor"), ("on", "cpu", False, "inductor"),
    ("off", "cuda", False, None), ("auto", "cuda", True, None), ("on", "cuda", True, None)])
def test_backend_resolution(mode: str, device: str, compile: bool, want: str | None):
    cfg = ActorConfig(lm_head_compile=mode, compile=compile)
    assert lm_head_compile_backend(cfg, torch.device(device)) == want


def test_off_with_actor_compile_is_an_error():
    with pytest.raises(ConfigError, match="actor.lm_head_compile=off with actor.compile=true"):
        lm_head_compile_backend(ActorConfig(lm_head_compile="off", compile=True), torch.device("cuda"))


def _batch(vocab: int):
    from trainer.bench.moe_backends import rl_batch

    b = rl_batch(type("C", (), {"vocab_size": vocab})(), 4, 8 + R, 8)
    b.response_mask[-1, R - 7:] = 0  # a shorter last response
    return b


def _update(mode: str) -> tuple[dict, dict[str, torch.Tensor], Actor]:
    model, _ = load_model_and_tokenizer(ModelConfig(path="tiny:qwen3_moe"), seed=0)
    cfg = ActorConfig(lr=1e-4, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, grad_clip=1e9,
                      logprob_chunk_size=16, entropy_coeff=0.01, lm_head_compile=mode, compile_backend="aot_eager")
    actor = Actor(model, cfg, temperature=0.9, max_response_length=R, device=torch.device("cpu"))
    grads: dict[str, torch.Tensor] = {}
    finish = actor.finish_grads_and_clip

    def recording() -> torch.Tensor:
        norm = finish()
        grads.update({k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None})
        return norm

    actor.finish_grads_and_clip = recording
    metrics = actor.update(_batch(model.config.vocab_size), 1, reuse_forward_as_old=True)
    return metrics, grads, actor


def test_compiled_head_update_equals_eager():
    torch._dynamo.reset()
    m_eager, g_eager, a_eager = _update("off")
    m_comp, g_comp, a_comp = _update("on")
    assert a_eager.lm_head_backend is None and a_comp.lm_head_backend == "aot_eager"
    assert set(m_comp) == set(m_eager)
    # the actor's own metrics (loss, entropy, KL, clip fractions, router statistics, grad norm); the training/*
    # invariant residuals are rounding-sized errors themselves, not quantities of the update
    actor_keys = [k for k in m_eager if k.startswith("actor/")]
    assert "actor/pg_loss" in actor_keys and "actor/moe/router_entropy" in actor_keys
    for k in actor_keys:
        v = m_eager[k]
        assert m_comp[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
    assert set(g_comp) == set(g_eager) and len(g_eager) > 10
    for k, g in g_eager.items():
        err = float((g_comp[k] - g).norm() / g.norm().clamp_min(1e-30))
        assert err < 1e-5, (k, err)

"""The SGLang engine gets from the Megatron backend what it gets from FSDP2, in the checkpoint layout.

SGLang is not installable here (trainer/rollout/sglang_engine.py), so `sglang_engine.build` runs
against the test double of `sglang.Engine` (`tests/helpers/engines.py`), which records every
`update_weights_from_tensor` call (its signature: `named_tensors`, `load_format`, `flush_cache`). After one Megatron update (megatron-core
through mbridge, CPU/gloo, fp32), the same weights go into two engines: from
`MegatronActor.named_weights()` and from the FSDP2 path (`Actor.named_weights()` of an HF model holding
those weights). Both must receive identical calls (bucket boundaries, names, bf16 tensors bit for bit,
flush on the last bucket only), and those tensors must be exactly the checkpoint `save_pretrained`
writes for the weights (per-expert MoE tensors, Mixtral's `block_sparse_moe`), which is what SGLang's
loaders read. Negative controls: the engine without its checkpoint layout (in-memory names: fused
`experts.gate_up_proj` for MoE) and an export with one expert's weights off by one bf16 step are
both caught by the same comparison.
"""

from __future__ import annotations

import copy
import sys
from types import SimpleNamespace

import pytest
import torch

from tests.helpers.batches import N_RESP, N, R, unequal_lengths_batch
from tests.helpers.engines import FakeSGLangEngine
from trainer.backends.strategy import megatron_missing
from trainer.config import ActorConfig, ModelConfig, TrainerConfig
from trainer.models.loading import load_model_and_tokenizer

pytestmark = pytest.mark.skipif(megatron_missing() is not None,
                                reason="needs megatron-core and mbridge (pip install 'rlbench[megatron]')")
BUCKET = 48 << 10  # bytes: several buckets even for the tiny models


def _hf(arch: str):
    m, tok = load_model_and_tokenizer(ModelConfig(path=f"tiny:{arch}"), seed=0)
    with torch.no_grad():  # routers away from zero so routing is no tie
        for r in m.modules():
            if type(r).__name__.endswith("TopKRouter"):
                r.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
    return m, tok


def _engine(model, tok, monkeypatch: pytest.MonkeyPatch):
    """`sglang_engine.build` on the double (the GPU check lifted: there is no GPU here)."""
    from trainer.rollout import sglang_engine

    monkeypatch.setitem(sys.modules, "sglang", SimpleNamespace(__version__="0.5.23", Engine=lambda **kwargs: FakeSGLangEngine()))
    monkeypatch.setattr(sglang_engine, "require_cuda", lambda engine, device: None)
    cfg = TrainerConfig.model_validate({"model": {"path": "tiny:x", "dtype": "bfloat16"},
                                        "rollout": {"engine": "sglang"}, "actor": {"strategy": "megatron"}})
    engine = sglang_engine.build(cfg, model, tok, [tok.eos_token_id], torch.device("cpu"))
    engine.bucket_bytes = BUCKET
    return engine


def _checkpoint(model) -> dict[str, torch.Tensor]:
    """What `save_pretrained` writes for `model` (its parameters; a tied LM head is not one), in bf16."""
    from trainer.backends.megatron.backend import hf_checkpoint_tensors

    out = {k: v.to(torch.bfloat16) for k, v in hf_checkpoint_tensors(model).items()}
    if getattr(model.config, "tie_word_embeddings", False):
        out.pop("lm_head.weight", None)
    return out


def _problems(got: FakeSGLangEngine, want: FakeSGLangEngine | None, checkpoint: dict[str, torch.Tensor]) -> list[str]:
    out = []
    if want is not None:
        a = [([n for n, _ in b], flush) for b, flush in got.updates]
        b = [([n for n, _ in b], flush) for b, flush in want.updates]
        if a != b:
            out.append("bucket names / flush flags differ from the FSDP2 path's")
        for (ba, _), (bb, _) in zip(got.updates, want.updates):
            out += [f"{n}: tensor differs from the FSDP2 path's" for (n, x), (_, y) in zip(ba, bb)
                    if x.dtype != y.dtype or not torch.equal(x, y)]
    sent = {n: t for bucket, _ in got.updates for n, t in bucket}
    if set(sent) != set(checkpoint):
        out.append(f"names differ from the checkpoint's: {sorted(set(sent) ^ set(checkpoint))[:3]}")
    out += [f"{n}: not the checkpoint's tensor" for n, t in sent.items()
            if n in checkpoint and (t.dtype != torch.bfloat16 or not torch.equal(t, checkpoint[n]))]
    if [flush for _, flush in got.updates] != [False] * (len(got.updates) - 1) + [True]:
        out.append("the cache is not flushed after the last bucket only")
    return out


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe", "mixtral"])
def test_megatron_and_fsdp2_send_sglang_the_same_checkpoint_buckets(arch: str, monkeypatch: pytest.MonkeyPatch):
    from trainer.backends.actor import Actor
    from trainer.backends.megatron.backend import MegatronActor

    hf, tok = _hf(arch)
    cfg = ActorConfig(lr=1e-2, ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2, grad_clip=1e9)
    meg = MegatronActor.from_hf(copy.deepcopy(hf), cfg, temperature=1.0, max_response_length=R,
                                device=torch.device("cpu"))
    batch, g = unequal_lengths_batch(5)
    batch.advantages = torch.randn(N_RESP, 1, generator=g).expand(N_RESP, R) * batch.response_mask
    meg.update(batch, N, reuse_forward_as_old=True)
    updated = dict(meg.named_weights())
    assert not torch.equal(updated["model.embed_tokens.weight"], hf.model.embed_tokens.weight)  # the update moved it
    missing, unexpected = hf.load_state_dict(updated, strict=False)  # the FSDP2 path's model, same weights
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # a tied head is the embedding
    fsdp2 = Actor(hf, cfg, temperature=1.0, max_response_length=R, device=torch.device("cpu"))
    checkpoint = _checkpoint(hf)

    engine = _engine(hf, tok, monkeypatch)  # one adapter; each send goes into a fresh double

    def send(weights, layout=engine.layout) -> FakeSGLangEngine:
        engine.engine, engine.layout = FakeSGLangEngine(), layout
        engine.update_weights(weights)
        return engine.engine

    got, want = send(meg.named_weights()), send(fsdp2.named_weights())
    assert len(got.updates) > 1  # several buckets
    assert _problems(got, want, checkpoint) == []

    # negative controls: the same comparison catches a missing checkpoint layout and a one-step error
    moe = arch != "qwen3"
    bare = send(meg.named_weights(), layout=None)
    assert bool(_problems(bare, None, checkpoint)) == moe  # the dense model's names are its checkpoint's
    key = "model.layers.1.mlp.experts.down_proj" if moe else "model.layers.1.mlp.down_proj.weight"

    def nudged():
        for name, t in meg.named_weights():
            if name == key:
                t = t.to(torch.bfloat16).clone()
                t.view(-1)[0] = torch.nextafter(t.view(-1)[0], torch.tensor(1e9, dtype=torch.bfloat16))
            yield name, t
    assert any("tensor differs" in p for p in _problems(send(nudged()), want, checkpoint))

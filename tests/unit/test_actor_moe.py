"""The actor trains MoE models: router load-balancing loss by its coefficient, actor/moe/* metrics,
and two FSDP2 workers (gloo) give one worker's update and statistics (counts summed over ranks)."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

from tests.helpers.batches import N_RESP, N, R, unequal_lengths_batch
from tests.helpers.ranks import leave_group, spawn_ranks
from trainer.backends.actor import Actor
from trainer.components.batch import Batch
from trainer.config import ActorConfig, ModelConfig
from trainer.errors import ConfigError
from trainer.models.loading import load_model_and_tokenizer

MOE_KEYS = {"actor/moe/load_balancing_loss", "actor/moe/router_entropy", "actor/moe/expert_load/max",
            "actor/moe/expert_load/min", "actor/moe/expert_load/cv"}


def _model(arch: str = "tiny:qwen3_moe"):
    m, _ = load_model_and_tokenizer(ModelConfig(path=arch), seed=0)
    with torch.no_grad():  # Qwen3-MoE's router starts at zero: give it a spread so the load is uneven
        for r in m.modules():
            if type(r).__name__.endswith("TopKRouter"):
                r.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
    return m


def _cfg(**kw) -> ActorConfig:
    return ActorConfig(lr=1e-3, ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=1, grad_clip=1e9, **kw)


def _batch() -> Batch:
    b, g = unequal_lengths_batch(11)
    b.advantages = torch.randn(N_RESP, 1, generator=g).expand(N_RESP, R) * b.response_mask
    b.old_logprobs = -2.0 + 0.1 * torch.randn(N_RESP, R, generator=g)
    return b


def _routers(model):
    return {k: v.detach().clone() for k, v in model.named_parameters() if k.endswith("gate.weight")}


def test_moe_metrics_and_aux_loss_coefficient():
    runs = {}
    for coeff in (0.0, 1.0):
        model = _model()
        actor = Actor(model, _cfg(moe_aux_loss_coeff=coeff), temperature=1.0, max_response_length=R,
                      device=torch.device("cpu"))
        metrics = actor.update(_batch(), N)
        runs[coeff] = (metrics, _routers(model))
    m0, r0 = runs[0.0]
    _, r1 = runs[1.0]
    assert MOE_KEYS <= set(m0)
    assert m0["actor/moe/expert_load/min"] <= 1.0 <= m0["actor/moe/expert_load/max"]
    assert 0 < m0["actor/moe/router_entropy"] < float(torch.log(torch.tensor(4.0)))
    # the first forward is the same in both runs, so the statistics start equal; the loss term moves the routers
    assert any(not torch.allclose(r0[k], r1[k], atol=1e-7) for k in r0)


def test_aux_loss_on_a_dense_model_is_an_error():
    m, _ = load_model_and_tokenizer(ModelConfig(path="tiny:qwen2"), seed=0)
    with pytest.raises(ConfigError, match=r"actor.moe_aux_loss_coeff=0.01: the model is not a mixture of experts"):
        Actor(m, _cfg(moe_aux_loss_coeff=0.01), temperature=1.0, max_response_length=R, device=torch.device("cpu"))


def _worker(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    from trainer.backends.fsdp import full_state_dict, init_data_parallel, shard_model
    from trainer.distributed.sharding import shard_batch, worker_actor_config

    init_data_parallel(rank, world, "127.0.0.1", port, backend="gloo")
    model = shard_model(_model("tiny:mixtral"), torch.device("cpu"))
    cfg = _cfg(moe_aux_loss_coeff=0.1)
    actor = Actor(model, worker_actor_config(cfg, world), temperature=1.0, max_response_length=R,
                  device=torch.device("cpu"))
    piece = shard_batch(_batch(), world_size=world, mini_batch_rows=cfg.ppo_mini_batch_size * N)[rank]
    metrics = actor.update(piece, N)
    state = full_state_dict(model)
    if rank == 0:
        torch.save({"state": state, "metrics": metrics}, out)
    leave_group()


def test_two_fsdp_workers_match_one_worker_moe():
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.pt")
        spawn_ranks(_worker, 2, out)
        got = torch.load(out)
    model = _model("tiny:mixtral")
    ref = Actor(model, _cfg(moe_aux_loss_coeff=0.1), temperature=1.0, max_response_length=R,
                device=torch.device("cpu")).update(_batch(), N)
    for k in MOE_KEYS | {"actor/grad_norm", "actor/pg_loss"}:
        assert abs(got["metrics"][k] - ref[k]) <= 1e-5 * max(abs(ref[k]), 1e-3), k
    # Adam's first step is ~lr * g / |g|: expert entries whose gradient is near zero (few tokens) amplify
    # the fp32 rounding of a different reduction order, so parameters agree to 1% of the 2e-3 step
    for name, want in model.named_parameters():
        torch.testing.assert_close(got["state"][name], want.detach(), rtol=1e-5, atol=2e-5, msg=name)

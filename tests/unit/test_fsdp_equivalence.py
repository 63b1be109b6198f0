"""Two FSDP2 workers (gloo, CPU) give the same update as one worker on the same global batch.

The batch has two mini-batches (two optimizer steps) of unequal response lengths, so a wrong
token count, a mean-instead-of-sum gradient reduction or a wrong shard order changes the result.
`actor/grad_norm` (before clipping) is compared too: Adam's first step is nearly scale-invariant,
the gradient norm is not. Tolerance: fp32 rounding of a different reduction order (1e-5 rel).
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

from tests.helpers.batches import N_RESP, N, R, tiny_qwen2, unequal_lengths_batch
from tests.helpers.ranks import leave_group, spawn_ranks
from trainer.backends.actor import Actor
from trainer.components.batch import Batch
from trainer.config import ActorConfig
from trainer.distributed.sharding import shard_batch, unshard_rows, worker_actor_config

MODES = ("token-mean", "seq-mean-token-mean")


def _actor_cfg(loss_agg_mode: str) -> ActorConfig:
    return ActorConfig(lr=1e-3, ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=1, grad_clip=1e9,
                       loss_agg_mode=loss_agg_mode, entropy_coeff=0.01)


def _batch() -> Batch:
    b, g = unequal_lengths_batch(7)
    b.advantages = torch.randn(N_RESP, 1, generator=g).expand(N_RESP, R) * b.response_mask
    b.old_logprobs = -2.0 + 0.1 * torch.randn(N_RESP, R, generator=g)
    return b


def _worker(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    from trainer.backends.fsdp import full_state_dict, init_data_parallel, shard_model

    init_data_parallel(rank, world, "127.0.0.1", port, backend="gloo")
    results = {}
    for mode in MODES:
        model = shard_model(tiny_qwen2(), torch.device("cpu"))
        cfg = _actor_cfg(mode)
        actor = Actor(model, worker_actor_config(cfg, world), temperature=1.0, max_response_length=R,
                      device=torch.device("cpu"))
        piece = shard_batch(_batch(), world_size=world, mini_batch_rows=cfg.ppo_mini_batch_size * N)[rank]
        metrics = actor.update(piece, N)
        results[mode] = {"state": full_state_dict(model), "metrics": metrics}
    if rank == 0:
        torch.save(results, out)
    leave_group()


def test_shard_batch_round_trip_keeps_global_order():
    b = _batch()
    pieces = shard_batch(b, world_size=2, mini_batch_rows=4)
    # worker 0 gets rows 0,1 (first half of mini-batch 0) and 4,5 (first half of mini-batch 1)
    assert torch.equal(pieces[0].group_index, torch.tensor([0, 0, 2, 2]))
    assert torch.equal(pieces[1].group_index, torch.tensor([1, 1, 3, 3]))
    back = unshard_rows([p.input_ids for p in pieces], world_size=2, mini_batch_rows=4)
    assert torch.equal(back, b.input_ids)


@pytest.fixture(scope="module")
def two_worker_results() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.pt")
        spawn_ranks(_worker, 2, out)
        return torch.load(out)


@pytest.mark.parametrize("mode", MODES)
def test_two_fsdp_workers_match_one_worker(mode: str, two_worker_results: dict):
    # one worker, no process group: the reference
    ref_model = tiny_qwen2()
    ref = Actor(ref_model, _actor_cfg(mode), temperature=1.0, max_response_length=R, device=torch.device("cpu"))
    ref_metrics = ref.update(_batch(), N)
    ref_state = {k: v.detach().clone() for k, v in ref_model.named_parameters()}
    init_state = {k: v.detach() for k, v in tiny_qwen2().named_parameters()}
    got = two_worker_results[mode]

    assert abs(got["metrics"]["actor/grad_norm"] - ref_metrics["actor/grad_norm"]) <= 1e-5 * ref_metrics["actor/grad_norm"]
    moved = 0.0
    for name, want in ref_state.items():
        have = got["state"][name]
        assert have.shape == want.shape, name
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-6, msg=f"{name} differs ({mode})")
        moved = max(moved, float((want - init_state[name]).abs().max()))
    assert moved > 1e-4  # the update did something, so agreement is not trivially "nothing changed"


def test_uneven_sharding_is_a_config_error_naming_the_field():
    from trainer.distributed.sharding import check_divisible
    from trainer.errors import ConfigError

    check_divisible(num_prompts=8, n=4, mini_batch_size=4, world_size=2)  # fine: 2 prompts per worker
    with pytest.raises(ConfigError, match="actor.ppo_mini_batch_size=6 must be a multiple of the 4 trainer workers"):
        check_divisible(num_prompts=12, n=4, mini_batch_size=6, world_size=4)
    with pytest.raises(ConfigError, match="not a multiple of actor.ppo_mini_batch_size=4"):
        check_divisible(num_prompts=10, n=4, mini_batch_size=4, world_size=2)

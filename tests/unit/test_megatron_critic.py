"""PPO's critic under the Megatron backend (`trainer/backends/megatron/critic.py`) against the FSDP2 critic.

Same policy weights, same value head, same batch (two mini-batches, unequal response lengths, a
left-padded prompt, old values spread so that some predictions are clipped): the megatron critic's values
equal the transformers critic's (fp32, 1e-5 absolute), and its update (two Adam steps) logs the same loss,
clip fraction and gradient norm (rel 1e-4) and leaves the same values (2e-5). On two gloo ranks, TP=2
(with sequence parallelism; slow tier: without it, and DP=2) gives the one-rank values and update.
`check_strategy` takes `critic.enable` under Megatron and refuses it with pipeline parallelism.
Needs megatron-core and mbridge.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

from tests.helpers.batches import N_RESP, N, R, unequal_lengths_batch
from tests.helpers.ranks import leave_group, spawn_ranks
from trainer.backends.strategy import megatron_missing
from trainer.components.batch import Batch
from trainer.config import CriticConfig, MegatronConfig, ModelConfig
from trainer.models.loading import load_model_and_tokenizer

pytestmark = pytest.mark.skipif(megatron_missing() is not None,
                                reason="needs megatron-core and mbridge (pip install 'rlbench[megatron]')")
CFG = CriticConfig(enable=True, lr=1e-3, cliprange_value=0.05, grad_clip=1e9)
KW = {"device": torch.device("cpu"), "mini_batch_size": 2, "micro_batch_size": 2, "ppo_epochs": 1,
      "loss_agg_mode": "token-mean"}
KEYS = ("critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm")


def _hf(arch: str = "qwen3"):
    return load_model_and_tokenizer(ModelConfig(path=f"tiny:{arch}"), seed=0)[0]


def _batch() -> Batch:
    b, g = unequal_lengths_batch(11)
    b.attention_mask[0, :2] = 0  # a left-padded prompt: the values are read where the FSDP2 critic reads them
    b.position_ids = (b.attention_mask.cumsum(-1) - 1).clamp(min=0)
    b.values = 0.1 * torch.randn(N_RESP, R, generator=g) * b.response_mask
    b.returns = torch.randn(N_RESP, R, generator=g) * b.response_mask
    return b


def _megatron(hf, tp: int = 1, sp: bool = False, dp: int = 1):
    from trainer.backends.megatron.critic import MegatronCritic

    kw = {**KW, "mini_batch_size": KW["mini_batch_size"] // dp}
    return MegatronCritic(hf, CFG, megatron=MegatronConfig(tensor_model_parallel_size=tp, sequence_parallel=sp), **kw)


@pytest.mark.parametrize("arch", ["qwen3", *(pytest.param(a, marks=pytest.mark.slow) for a in ("llama", "qwen3_moe"))])
def test_values_and_update_match_the_fsdp2_critic(arch):
    from trainer.backends.critic import Critic

    hf = _hf(arch)
    ref = Critic(hf, CFG, **KW)
    meg = _megatron(hf)
    assert meg.gpt.output_layer is None and not any("output_layer" in k for k in meg.model.state_dict())
    with torch.no_grad():  # the heads differ by initialization only (module docstring): copy the reference's
        meg.model.value_head.load_state_dict(ref.model.value_head.state_dict())
    batch = _batch()
    mask = batch.response_mask.bool()
    want, got = ref.compute_values(batch), meg.compute_values(batch)
    assert (got - want)[mask].abs().max() < 1e-5 and got[~mask].abs().max() == 0
    m_ref, m_meg = ref.update(batch, N), meg.update(batch, N)
    assert set(m_meg) == set(m_ref)
    for k in KEYS:
        assert m_meg[k] == pytest.approx(m_ref[k], rel=1e-4, abs=1e-6), (k, m_meg[k], m_ref[k])
    assert 0 < m_meg["critic/vf_clipfrac"] < 1  # the clipped branch is exercised
    after_ref, after = ref.compute_values(batch), meg.compute_values(batch)
    assert (after - want)[mask].abs().max() > 1e-3  # two Adam steps moved the values ...
    assert (after - after_ref)[mask].abs().max() < 2e-5  # ... the same way
    # state round trip: a fresh critic loaded with the state gives the same values
    other = _megatron(_hf(arch))
    other.load_state_dict(meg.state_dict())
    assert torch.equal(other.compute_values(batch), meg.compute_values(batch))
    assert meg.checkpoint_layout() == "megatron_tp1_pp1_ep1_world1"


def test_updates_fit_the_returns():
    """PPO's use: old values from the critic itself, then its update; the value loss falls step after step."""
    from trainer.backends.megatron.critic import MegatronCritic

    critic = MegatronCritic(_hf(), CFG.model_copy(update={"lr": 1e-4, "cliprange_value": 0.5, "grad_clip": 1.0}),
                            megatron=MegatronConfig(), **KW)
    batch = _batch()
    losses = []
    for _ in range(3):
        batch.values = critic.compute_values(batch)
        losses.append(critic.update(batch, N)["critic/vf_loss"])
    assert losses[0] > losses[1] > losses[2] > 0, losses


def test_critic_accepted_and_pipeline_parallel_refused(tmp_path):
    from tests.helpers.configs import tiny_config
    from trainer.backends.megatron.critic import MegatronCritic
    from trainer.backends.strategy import check_strategy
    from trainer.config import load_config
    from trainer.errors import ConfigError

    def cfg(**megatron):
        return load_config(tiny_config(str(tmp_path / "run"), model={"path": "tiny:qwen3"}, critic={"enable": True},
                                       algorithm={"name": "ppo", "adv_estimator": "gae"},
                                       actor={"strategy": "megatron", "megatron": megatron},
                                       trainer={"use_ray": True, "n_gpus_per_node": 2}))

    check_strategy(cfg())
    check_strategy(cfg(tensor_model_parallel_size=2, sequence_parallel=True))
    with pytest.raises(ConfigError, match=r"^critic\.enable: the value model is not built under pipeline "
                                          r"parallelism \(actor\.megatron\.pipeline_model_parallel_size=2\) \(fix: "):
        check_strategy(cfg(pipeline_model_parallel_size=2))
    with pytest.raises(ConfigError, match=r"^critic\.enable: .*pipeline_model_parallel_size=2\) \(fix: "):
        MegatronCritic(_hf(), CFG, megatron=MegatronConfig(pipeline_model_parallel_size=2), **KW)


def _worker(rank: int, world: int, port: int, tp: int, sp: bool, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from trainer.distributed.sharding import shard_batch

    dp = world // tp
    critic = _megatron(_hf(), tp, sp, dp)
    batch = _batch()
    values = critic.compute_values(batch)
    piece = batch if dp == 1 else shard_batch(batch, world_size=dp, mini_batch_rows=2 * N)[rank]
    metrics = critic.update(piece, N)
    after = critic.compute_values(batch)
    if rank == 0:
        torch.save({"values": values, "metrics": metrics, "after": after}, out)
    leave_group()


@pytest.mark.integration
@pytest.mark.parametrize(("tp", "sp"), [
    # slow tier: TP=2 without SP (the default tier's tp2-sp covers the replicated head and more), DP=2
    pytest.param(2, False, id="tp2", marks=pytest.mark.slow),
    pytest.param(2, True, id="tp2-sp"),
    pytest.param(1, False, id="dp2", marks=pytest.mark.slow)])
def test_two_ranks_match_one(tp, sp):
    """TP=2 (each rank the whole batch; the head replicated), TP=2 with sequence parallelism (the decoder's
    sequence slices gathered before the head) and DP=2 (each rank half of every mini-batch; counts, statistics
    and gradients summed over the data-parallel group) give the one-rank critic's values, update and values after."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.pt")
        spawn_ranks(_worker, 2, tp, sp, out)
        got = torch.load(out)
    one = _megatron(_hf())
    batch = _batch()
    torch.testing.assert_close(got["values"], one.compute_values(batch), rtol=0, atol=1e-5)
    ref = one.update(batch, N)
    for k in KEYS:
        assert got["metrics"][k] == pytest.approx(ref[k], rel=1e-4, abs=1e-6), (k, got["metrics"][k], ref[k])
    torch.testing.assert_close(got["after"], one.compute_values(batch), rtol=0, atol=2e-5)

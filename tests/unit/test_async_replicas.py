"""Pieces of fully-async mode with several rollout replicas: one broadcast reaches every replica,
the weight digest that compares replicas, the staleness cap's split, the token-version check."""

from __future__ import annotations

import socket
import threading

import pytest
import torch

from trainer.config import ModelConfig
from trainer.errors import ConfigError
from trainer.models.loading import load_model_and_tokenizer
from trainer.modes.fully_async import replica_shares, token_version_errors
from trainer.rollout.hf import HFRolloutEngine
from trainer.rollout.weight_sync import SyncGroup, WeightSpec, receive, send, weight_fingerprint


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_one_broadcast_reaches_two_replicas():
    torch.manual_seed(0)
    src = {"w1": torch.randn(64, 32), "w2": torch.randn(7)}
    plan = [WeightSpec("w1", (64, 32), torch.float32), WeightSpec("w2", (7,), torch.bfloat16)]
    port, got = _port(), {1: {}, 2: {}}

    def replica(rank: int) -> None:
        g = SyncGroup(rank, 3, "127.0.0.1", port, device=torch.device("cpu"))
        got[rank].update({n: t.clone() for n, t in receive(g, plan, bucket_mb=0.001)})

    threads = [threading.Thread(target=replica, args=(r,)) for r in (1, 2)]
    for t in threads:
        t.start()
    send(SyncGroup(0, 3, "127.0.0.1", port, device=torch.device("cpu")), plan, iter(src.items()), bucket_mb=0.001)
    for t in threads:
        t.join(timeout=60)
    for rank in (1, 2):
        assert torch.equal(got[rank]["w1"], src["w1"])
        assert torch.equal(got[rank]["w2"], src["w2"].to(torch.bfloat16))


class _Remote:
    """An engine whose weights are not in this process (as vLLM's): only `generate` is visible."""

    def __init__(self, engine: HFRolloutEngine):
        self._engine = engine

    def generate(self, prompts, params):
        return self._engine.generate(prompts, params)


@pytest.mark.parametrize("remote", [False, True], ids=["params", "probe"])
def test_weight_fingerprint_tells_replicas_apart_only_when_weights_differ(remote: bool):
    model, tok = load_model_and_tokenizer(ModelConfig(path="tiny:qwen2"), seed=0)
    a, b = (HFRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=[tok.eos_token_id], seed=s)
            for s in (0, 1))
    wrap = _Remote if remote else (lambda e: e)
    assert weight_fingerprint(wrap(a)) == weight_fingerprint(wrap(b))  # same weights, different sampling seeds
    new = [(n, p.detach() + 0.05 * torch.randn_like(p)) for n, p in model.named_parameters()]
    a.update_weights(iter(new))  # one replica got the sync, the other did not
    assert weight_fingerprint(wrap(a)) != weight_fingerprint(wrap(b))
    b.update_weights(iter(new))
    assert weight_fingerprint(wrap(a)) == weight_fingerprint(wrap(b))


def test_replica_shares_split_the_staleness_cap():
    assert replica_shares(12, 2) == [6, 6]
    assert replica_shares(13, 3) == [5, 4, 4] and sum(replica_shares(13, 3)) == 13
    with pytest.raises(ConfigError, match="async.rollout_gpus=4") as e:
        replica_shares(3, 4)
    assert "\n" not in str(e.value) and "fix:" in str(e.value)


def test_token_version_errors_counts_tokens_outside_start_end_or_going_back():
    ok = {"start_version": 2, "end_version": [3, 2], "token_versions": [[2, 2, 3], [2]]}
    assert token_version_errors([(ok, None)]) == 0
    back = {"start_version": 2, "end_version": [3], "token_versions": [[2, 3, 2]]}
    early = {"start_version": 2, "end_version": [2], "token_versions": [[1, 2]]}
    late = {"start_version": 2, "end_version": [2], "token_versions": [[2, 3]]}
    assert token_version_errors([(back, None), (early, None), (late, None)]) == 3


@pytest.mark.parametrize("mode, fix", [("fully_async", "async.rollout_gpus"), ("colocated", "trainer.n_gpus_per_node")])
def test_tensor_parallel_inside_a_ray_replica_is_refused_in_one_line(tmp_path, mode: str, fix: str):
    from trainer.config import load_config
    from trainer.distributed.trainer_worker import check_supported

    cfg = load_config("trainer/configs/grpo_tiny_arithmetic.yaml", [
        f"trainer.out_dir={tmp_path}", f"trainer.mode={mode}", "rollout.engine=vllm", "rollout.tensor_parallel_size=2",
        "async.rollout_gpus=2"])
    with pytest.raises(ConfigError, match="rollout.tensor_parallel_size=2") as e:
        check_supported(cfg)
    assert "\n" not in str(e.value) and f"add replicas with {fix}" in str(e.value)


def test_more_prompts_per_call_than_a_replica_may_start_is_refused_before_ray_starts(tmp_path):
    from trainer.config import load_config
    from trainer.modes.fully_async import train_fully_async

    # cap 4 * (1 + 0) * 1 = 4 groups per version over 2 replicas: 2 each, a call of 3 could never start
    cfg = load_config("trainer/configs/grpo_tiny_arithmetic.yaml", [
        f"trainer.out_dir={tmp_path}", "trainer.mode=fully_async", "async.rollout_gpus=2",
        "async.staleness_threshold=0", "async.trigger_parameter_sync_step=1", "async.rollout_groups_per_call=3"])
    with pytest.raises(ConfigError, match="async.rollout_groups_per_call=3") as e:
        train_fully_async(cfg)
    assert "\n" not in str(e.value) and "at most 2" in str(e.value)
    assert not (tmp_path / "metrics.jsonl").exists()

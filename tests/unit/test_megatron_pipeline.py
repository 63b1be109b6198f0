"""Pipeline parallelism of the Megatron backend (`trainer/backends/megatron/pipeline.py`), CPU / gloo.

Two gloo processes with `actor.megatron.pipeline_model_parallel_size=2` (each rank one stage, half the
decoder layers) against one process with PP=1, same HF weights loaded through the bridge both times,
for a dense model with tied embeddings (tiny qwen3), one with untied embeddings (tiny llama) and an MoE
(tiny qwen3_moe, megatron's aux loss on): the same log-probs (1e-5), the same update metrics on both
ranks (pg_loss, entropy, grad_norm, MoE router statistics; 1e-4 relative), and after one update (two
mini-batches of two micro-batches each, unequal response lengths) the same exported HF-named weights,
on both ranks, within the two-rank test's bound of `tests/unit/test_megatron_backend.py`; with qwen3,
each rank's state saved after that update and loaded into a fresh PP=2 actor gives the next update's
metrics and weights exactly. Slow tier: PP=2 x TP=2 with sequence parallelism and EP=2 on 4 ranks
(qwen3_moe), the same checks. The tiny models are built with 4 layers (2 per stage). `python3 -m pytest -m integration tests/unit/test_megatron_pipeline.py`
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

from tests.helpers.batches import N_RESP, N, R, unequal_lengths_batch
from tests.helpers.configs import tiny_config
from tests.helpers.ranks import leave_group, spawn_ranks
from trainer.backends.strategy import check_strategy, megatron_missing
from trainer.components.batch import Batch
from trainer.config import ActorConfig, MegatronConfig, ModelConfig, load_config
from trainer.errors import ConfigError
from trainer.models.loading import load_model_and_tokenizer

pytestmark = pytest.mark.skipif(megatron_missing() is not None,
                                reason="needs megatron-core and mbridge (pip install 'rlbench[megatron]')")
CASES = {"qwen3": {}, "llama": {"tie_word_embeddings": False}, "qwen3_moe": {}}
METRICS = ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/ppo_kl", "actor/pg_clipfrac")
MOE_METRICS = ("actor/moe/load_balancing_loss", "actor/moe/router_entropy", "actor/moe/expert_load/max",
               "actor/moe/expert_load/cv")


def _hf(arch: str):
    overrides = {"num_hidden_layers": 4, **CASES[arch]}
    m, _ = load_model_and_tokenizer(ModelConfig(path=f"tiny:{arch}", override_config=overrides), seed=0)
    with torch.no_grad():  # routers away from zero (Qwen3-MoE's start there) so routing is not a tie
        for r in m.modules():
            if type(r).__name__.endswith("TopKRouter"):
                r.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
    return m


def _megatron(arch: str, pp: int = 1, dp: int = 1, **layout):
    from trainer.backends.megatron.backend import MegatronActor
    from trainer.distributed.sharding import worker_actor_config

    cfg = ActorConfig(lr=1e-3, ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2, grad_clip=1e9,
                      entropy_coeff=0.01, moe_aux_loss_coeff=0.01 if arch == "qwen3_moe" else 0.0,
                      megatron=MegatronConfig(pipeline_model_parallel_size=pp, **layout))
    return MegatronActor.from_hf(_hf(arch), worker_actor_config(cfg, dp), temperature=1.0, max_response_length=R,
                                 device=torch.device("cpu"))


def _batch() -> Batch:
    b, g = unequal_lengths_batch(5)
    b.advantages = torch.randn(N_RESP, 1, generator=g).expand(N_RESP, R) * b.response_mask
    b.old_logprobs = -2.0 + 0.1 * torch.randn(N_RESP, R, generator=g)
    return b


def _worker(rank: int, world: int, port: int, arch: str, layout: dict, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from trainer.distributed.sharding import shard_batch

    dp = world // (2 * layout.get("tensor_model_parallel_size", 1))
    meg = _megatron(arch, pp=2, dp=dp, **layout)
    layers = len(meg.gpt.decoder.layers)
    logp = meg.compute_logprobs(_batch())
    dp_rank, _ = meg.data_parallel()
    piece = _batch() if dp == 1 else shard_batch(_batch(), world_size=dp, mini_batch_rows=2 * N)[dp_rank]
    metrics = meg.update(piece, N)
    weights = {k: v.clone() for k, v in meg.named_weights()}  # this stage's are views of the parameters
    resumed = _resume_check(meg, rank, f"{out}.ckpt") if arch == "qwen3" else None
    torch.save({"logp": logp, "metrics": metrics, "weights": weights, "layers": layers,
                "layout": meg.checkpoint_layout(), "resume": resumed}, f"{out}.{rank}")
    leave_group()


def _resume_check(meg, rank: int, path: str) -> dict:
    """Per-rank state saved after the first update (`save_actor_state`), loaded into a fresh PP=2 actor: the
    second update from it against the second update of the run that went on."""
    from pathlib import Path

    from trainer.distributed.actor_state import load_actor_state, save_actor_state

    save_actor_state(meg, Path(path), rank)
    batch = _batch()
    batch.advantages = -batch.advantages  # another batch
    went_on = (meg.update(batch, N), {k: v.clone() for k, v in meg.named_weights()})
    fresh = _megatron("qwen3", pp=2)
    load_actor_state(fresh, Path(path), rank)
    resumed = (fresh.update(batch, N), dict(fresh.named_weights()))
    return {"metrics": [went_on[0], resumed[0]], "weights": [went_on[1], resumed[1]]}


def run_two_stages(arch: str, world: int = 2, **layout) -> list[dict]:
    """Every rank's results of the PP=2 run (`layout`: the other MegatronConfig sizes)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank")
        spawn_ranks(_worker, world, arch, layout, out)
        return [torch.load(f"{out}.{r}") for r in range(world)]


def weight_mismatch(got: dict[str, torch.Tensor], ref: list[tuple[str, torch.Tensor]]) -> list[tuple]:
    """Tensors outside the two-rank bound: all but <= 0.1% of each within 2e-5, the rest within 2.5e-4 (a quarter
    of one Adam step at lr 1e-3, where a gradient within rounding of zero makes g / sqrt(v) ill-conditioned)."""
    bad = []
    for k, v in ref:
        d = (got[k] - v).abs()
        if float(d.max()) > 2.5e-4 or int((d > 2e-5).sum()) > max(1, d.numel() // 1000):
            bad.append((k, float(d.max()), int((d > 2e-5).sum()), d.numel()))
    return bad


@pytest.mark.integration
@pytest.mark.parametrize("arch", list(CASES))
def test_two_stages_match_one(arch):
    ranks = run_two_stages(arch)
    assert [r["layers"] for r in ranks] == [2, 2]  # each stage built only its own half of the 4 layers
    assert ranks[0]["layout"] == "megatron_tp1_pp2_ep1_world2"
    check_against_one_rank(arch, ranks)


@pytest.mark.integration
@pytest.mark.slow  # 4 processes on 2 cores, ~28 s
def test_pipeline_with_tp_sp_ep_matches_one():
    """PP=2 x TP=2 with sequence parallelism, EP=2 folded into the TP ranks (qwen3_moe, 4 gloo ranks): the
    stages' sequence-parallel slices (rows padded to a multiple of TP) travel between the stages, and a
    later stage's routers get their slice of the padding mask."""
    ranks = run_two_stages("qwen3_moe", world=4, tensor_model_parallel_size=2, sequence_parallel=True,
                           expert_model_parallel_size=2)
    assert ranks[0]["layout"] == "megatron_tp2_pp2_ep2_world4"
    check_against_one_rank("qwen3_moe", ranks)


def check_against_one_rank(arch: str, ranks: list[dict]) -> None:
    one = _megatron(arch)
    ref_logp = one.compute_logprobs(_batch())
    ref_m = one.update(_batch(), N)
    ref_w = list(one.named_weights())
    keys = METRICS + (MOE_METRICS if arch == "qwen3_moe" else ())
    for r in ranks:  # every rank returns the last stage's log-probs, the same metrics and the whole model
        torch.testing.assert_close(r["logp"], ref_logp, rtol=0, atol=1e-5)
        for k in keys:
            assert abs(r["metrics"][k] - ref_m[k]) <= 1e-4 * max(abs(ref_m[k]), 1e-2), (k, r["metrics"][k], ref_m[k])
        assert list(r["weights"]) == [k for k, _ in ref_w]  # the HF model's names, in its order, once each
        assert weight_mismatch(r["weights"], ref_w) == []
        if r["resume"] is not None:  # each rank's own state comes back exactly
            (m_on, m_re), (w_on, w_re) = r["resume"]["metrics"], r["resume"]["weights"]
            assert {k: v for k, v in m_on.items() if not k.startswith("perf/")} == \
                {k: v for k, v in m_re.items() if not k.startswith("perf/")}
            assert all(torch.equal(w_on[k], w_re[k]) for k in w_on)
            assert not torch.equal(w_on["model.embed_tokens.weight"], r["weights"]["model.embed_tokens.weight"])


def _meg_cfg(tmp_path, *, trainer: dict | None = None, model: str = "tiny:qwen3", **megatron):
    sections = {"model": {"path": model}, "actor": {"strategy": "megatron", "megatron": megatron},
                "trainer": trainer or {}}
    return load_config(tiny_config(str(tmp_path / "run"), **sections))


RAY = {"use_ray": True, "n_gpus_per_node": 2}


FOUR = {**RAY, "n_gpus_per_node": 4}


@pytest.mark.parametrize(("trainer", "megatron", "match"), [
    ({}, {}, r"the single-process loop has one rank \(fix: trainer\.use_ray=true"),
    ({**RAY, "n_gpus_per_node": 3}, {},
     r"2 stages x tensor_model_parallel_size=1 = 2 ranks does not divide the 3 trainer ranks"),
    (FOUR, {"tensor_model_parallel_size": 4}, r"2 stages x tensor_model_parallel_size=4 = 8 ranks does not divide the 4"),
    (FOUR, {"expert_model_parallel_size": 4}, r"2 stages x expert_model_parallel_size=4 = 8 ranks does not divide the 4"),
])
def test_pipeline_settings_not_run_stop_at_start(tmp_path, trainer, megatron, match):
    model = "tiny:qwen3_moe" if "expert_model_parallel_size" in megatron else "tiny:qwen3"
    with pytest.raises(ConfigError, match=r"^actor\.megatron\.pipeline_model_parallel_size=2: " + match) as e:
        check_strategy(_meg_cfg(tmp_path, trainer=trainer, model=model, pipeline_model_parallel_size=2, **megatron))
    assert "\n" not in str(e.value) and "(fix: " in str(e.value)


def test_pipeline_layouts_that_run_are_accepted(tmp_path):
    check_strategy(_meg_cfg(tmp_path, trainer=RAY, pipeline_model_parallel_size=2))
    check_strategy(_meg_cfg(tmp_path, trainer={**RAY, "n_gpus_per_node": 4}, model="tiny:qwen3_moe",
                            pipeline_model_parallel_size=2, expert_model_parallel_size=2))
    check_strategy(_meg_cfg(tmp_path, trainer=FOUR, model="tiny:qwen3_moe", pipeline_model_parallel_size=2,
                            tensor_model_parallel_size=2, sequence_parallel=True, expert_model_parallel_size=2))


def test_pipeline_model_checks():
    """Layers that do not split evenly over the stages, and megatron's DDP / distributed optimizer (the CUDA
    path, not run with pipeline parallelism), stop before anything is built."""
    from types import SimpleNamespace

    from trainer.backends.megatron.pipeline import check_pipeline_model

    cfg = ActorConfig(megatron=MegatronConfig(pipeline_model_parallel_size=4))
    for layers in (2, 6):
        with pytest.raises(ConfigError, match=rf"^actor\.megatron\.pipeline_model_parallel_size=4: the model's "
                                              rf"{layers} decoder layers do not split evenly over 4 stages"):
            check_pipeline_model(cfg, SimpleNamespace(num_hidden_layers=layers), False)
    check_pipeline_model(cfg, SimpleNamespace(num_hidden_layers=8), False)
    with pytest.raises(ConfigError, match=r"not built with megatron's DDP .* \(fix: actor\.megatron\.optimizer=torch"):
        check_pipeline_model(cfg, SimpleNamespace(num_hidden_layers=8), True)


def test_global_layer_names():
    from trainer.backends.megatron.pipeline import global_layer_name

    assert global_layer_name("decoder.layers.1.mlp.linear_fc1.weight", 2) == "decoder.layers.3.mlp.linear_fc1.weight"
    assert global_layer_name("module.decoder.layers.0.self_attention.linear_qkv.weight", 4) == \
        "module.decoder.layers.4.self_attention.linear_qkv.weight"
    assert global_layer_name("embedding.word_embeddings.weight", 2) == "embedding.word_embeddings.weight"


def test_aux_loss_scale_takes_the_schedules_shape():
    """megatron keeps the first aux-loss scale tensor it is given and copies later ones into it; its schedules
    give shape [1], so the actor's per-micro-batch scale (set before the first schedule call when an update comes
    first) must have that shape too, or the schedule's copy fails."""
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

    from trainer.backends.megatron.moe import set_aux_loss_scale

    saved = MoEAuxLossAutoScaler.main_loss_backward_scale
    try:
        MoEAuxLossAutoScaler.main_loss_backward_scale = None
        set_aux_loss_scale(0.25, torch.device("cpu"))
        MoEAuxLossAutoScaler.set_loss_scale(torch.ones(1) / 2)  # forward_step_calc_loss: 1 / num_microbatches
        assert MoEAuxLossAutoScaler.main_loss_backward_scale.tolist() == [0.5]
        set_aux_loss_scale(0.25, torch.device("cpu"))
        assert MoEAuxLossAutoScaler.main_loss_backward_scale.tolist() == [0.25]
    finally:
        MoEAuxLossAutoScaler.main_loss_backward_scale = saved

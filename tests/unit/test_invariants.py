"""The mechanics invariants' witnesses (trainer/components/invariants.py): clean inputs pass, planted faults fail."""

from __future__ import annotations

import ast
import functools
import shutil
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from trainer.algorithms.aggregation import agg_loss, global_counts
from trainer.algorithms.kl import kl_penalty
from trainer.algorithms.policy_loss import compute_policy_loss
from trainer.components import invariants as inv
from trainer.rewards import arithmetic, compute_score, known_data_sources


def _score(ds, text, gt):
    return compute_score(ds, text, gt).score


def test_every_reward_type_has_known_answers_and_scores_them_right():
    sources = {ds.rstrip("*") + ("-2025" if ds.endswith("*") else "") for ds in known_data_sources()}
    cases, failures, bad = inv.reward_audit(sources, _score)
    assert failures == 0, bad
    assert cases >= 20 * len(sources) // 2


def test_reward_audit_fails_a_scorer_that_reads_the_first_number(monkeypatch):
    monkeypatch.setattr(arithmetic, "extract_answer",
                        lambda s: (arithmetic._NUMBER_RE.findall(s) or [None])[0])
    _, failures, bad = inv.reward_audit({"synthetic/arithmetic"}, _score)
    assert failures > 0 and any("then" in b for b in bad)


def test_reward_audit_counts_a_data_source_without_a_table():
    assert inv.reward_audit({"no/such"}, _score)[1] == 1


def test_data_witness_repeats_and_epochs():
    w = inv.DataWitness(10, 4)  # 2 draws per epoch
    assert w.record([0, 1, 2, 3])["training/data_repeats_in_epoch"] == 0
    assert w.record([3, 4, 5, 6])["training/data_repeats_in_epoch"] == 1  # 3 again in epoch 0
    assert w.record([0, 1, 2, 3])["training/data_repeats_in_epoch"] == 0 and w.epoch == 1
    assert w.record([5, 5, 7, 8])["training/data_repeats_in_epoch"] == 1  # twice in one draw


def test_generation_violations():
    eos, pad = [2], 0
    resp = torch.tensor([[5, 6, 2, pad], [5, 6, 7, 8], [5, 2, 7, pad], [5, 6, pad, pad]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.float32)
    finish = ["stop", "length", "stop", "length"]
    # row 2 goes on past its stop token, row 3 ends early without one
    assert inv.generation_violations(resp, mask, finish, eos, 4) == 2
    assert inv.generation_violations(resp[:2], mask[:2], finish[:2], eos, 4) == 0
    assert inv.generation_violations(resp[:2], mask[:2], ["length", "length"], eos, 4) == 1  # wrong reason
    shifted = torch.tensor([[0, 1, 1, 1]], dtype=torch.float32)
    assert inv.generation_violations(resp[:1], shifted, None, eos, 4) == 1


def _adam_cfg(**kw):
    base = {"lr": 1e-3, "betas": (0.9, 0.999), "weight_decay": 0.1, "warmup_steps": 3, "grad_clip": 1.0}
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("bug", [None, "lr", "betas"])
def test_optimizer_witness(bug):
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 8)
    cfg = _adam_cfg()
    lr = cfg.lr * (3 if bug == "lr" else 1)
    betas = cfg.betas[::-1] if bug == "betas" else cfg.betas
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup_steps))
    w = inv.OptimizerWitness(opt, cfg)
    for _ in range(4):
        opt.zero_grad()
        w.check_zero_grads()
        model(torch.randn(16, 32)).square().mean().backward()
        pre = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        w.check_clip(float(pre))
        opt.step()
        sched.step()
    m = w.metrics(expected_steps=4)
    assert m["training/optimizer_steps_err"] == 0 and m["training/grad_stale_max"] == 0
    assert m["training/grad_clip_err"] < 1e-5
    if bug is None:
        assert m["training/optimizer_update_err"] <= 1.0
    else:
        assert m["training/optimizer_update_err"] > 100


def test_optimizer_witness_sees_stale_gradients():
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters())
    w = inv.OptimizerWitness(opt, _adam_cfg(warmup_steps=0))
    model(torch.randn(3, 4)).sum().backward()
    w.check_zero_grads()  # not zeroed
    assert w.metrics(0)["training/grad_stale_max"] > 0


@dataclass
class _Micro:
    response_mask: torch.Tensor
    advantages: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    rollout_logprobs: torch.Tensor


def _micro(n=6, r=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(n, r, generator=g) > 0.2).float()
    mask[:, 0] = 1
    return _Micro(response_mask=mask, advantages=torch.randn(n, 1, generator=g).expand(n, r).clone(),
                           old_logprobs=-torch.rand(n, r, generator=g) * 2, ref_logprobs=-torch.rand(n, r, generator=g) * 2,
                           rollout_logprobs=-torch.rand(n, r, generator=g) * 2)


def _loss_cfg(**kw):
    base = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0, "tis_cap": None,
            "loss_agg_mode": "token-mean", "use_kl_loss": True, "kl_loss_type": "low_var_kl", "kl_loss_coef": 0.1,
            "entropy_coeff": 0.01, "moe_aux_loss_coeff": 0.0}
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("kl_sign", [1.0, -1.0])
def test_expected_loss_matches_the_trainer_math_and_sees_a_flipped_kl(mode, kl_sign):
    cfg = _loss_cfg(loss_agg_mode=mode)
    micro = _micro()
    g = torch.Generator().manual_seed(1)
    logp = micro.old_logprobs + 0.5 * torch.randn(micro.old_logprobs.shape, generator=g)  # ratios past the clip
    entropy = torch.rand(logp.shape, generator=g)
    counts = global_counts(micro.response_mask)
    kw = dict(horizon=5, **counts)
    pg, m = compute_policy_loss(micro.old_logprobs, logp, micro.advantages, micro.response_mask,
                                clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode=mode, **kw)
    kl = agg_loss(kl_penalty(logp, micro.ref_logprobs, "low_var_kl"), micro.response_mask, mode, **kw)
    ent = agg_loss(entropy, micro.response_mask, mode, **kw)
    loss = pg + kl_sign * 0.1 * kl - 0.01 * ent
    want, scale, frac = inv.expected_loss(cfg, micro, logp, entropy, None, counts, 5, micro.old_logprobs)
    err = abs(float(loss) - want) / scale
    assert float(m["actor/pg_clipfrac"]) > 0
    assert abs(float(m["actor/pg_clipfrac"]) - frac) < 1e-7  # one micro-batch = the whole mini-batch
    if kl_sign > 0:
        assert err < 1e-5
    else:
        assert err > 1e-2


def test_loss_witness_probe_makes_the_kl_term_live_on_policy():
    """On-policy with the reference equal to the policy the KL term is 0 whatever its sign; the probe moves it."""
    cfg = _loss_cfg(entropy_coeff=0.0)
    micro = _micro()
    logp = micro.old_logprobs.clone()
    micro.ref_logprobs = logp.clone()
    counts = global_counts(micro.response_mask)

    def loss_fn(m, lp, ent, routed, *, sign):
        pg, pm = compute_policy_loss(m.old_logprobs, lp, m.advantages, m.response_mask, clip_ratio_low=0.2,
                                     clip_ratio_high=0.28, clip_ratio_c=3.0, **counts)
        kl = agg_loss(kl_penalty(lp, m.ref_logprobs, "low_var_kl"), m.response_mask, "token-mean", **counts)
        return pg + sign * 0.1 * kl, SimpleNamespace(stats={"actor/pg_clipfrac": float(pm["actor/pg_clipfrac"])})

    for sign, bad in ((1.0, False), (-1.0, True)):
        w = inv.LossWitness(cfg, horizon=5)
        fn = functools.partial(loss_fn, sign=sign)
        wrapped = w.wrap(fn, fn, counts, reuse_forward_as_old=False)
        wrapped(micro, logp, torch.zeros_like(logp), None)
        err = w.metrics()["training/loss_witness_err"]
        assert (err > 1e-2) if bad else (err < 1e-5)


def test_random_mutants_all_apply_and_parse(tmp_path):
    from rlbench.selftest.mutations import TRAINER_DIR
    from rlbench.selftest.random_mutants import apply_mutant, enumerate_mutants

    mutants = enumerate_mutants()
    assert len(mutants) > 200 and {m.op for m in mutants} >= {"binop", "compare", "constant", "drop"}
    files = {m.file for m in mutants}
    for m in mutants[::7]:
        (tmp_path / "trainer" / m.file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(TRAINER_DIR / m.file, tmp_path / "trainer" / m.file)
        apply_mutant(m, tmp_path)
        text = (tmp_path / "trainer" / m.file).read_text()
        ast.parse(text)
        assert text != (TRAINER_DIR / m.file).read_text()
    assert len(files) >= 8


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_witness_reads_k3_rounding_as_clean_and_a_small_live_kl_of_the_wrong_sign_as_wrong(seed):
    """Zero advantages, the policy within ~1e-4 nats of the reference: the loss is the k3 term alone, ~1e-9,
    and its float32 value is mostly rounding. Clean reads 0-ish; the wrong sign once the KL is ~1e-5 reads
    large (on the real micro-batch, not the probe: the wrapper is not used here)."""
    cfg = _loss_cfg(entropy_coeff=0.0)
    g = torch.Generator().manual_seed(seed)
    n, r = 8, 64
    mask = torch.ones(n, r)
    logp = -5 * torch.rand(n, r, generator=g)
    counts = global_counts(mask)

    def err(noise: float, sign: float) -> float:
        ref = logp + noise * torch.randn(n, r, generator=g)
        micro = _Micro(response_mask=mask, advantages=torch.zeros(n, r), old_logprobs=logp.clone(),
                       ref_logprobs=ref, rollout_logprobs=logp.clone())
        pg, _ = compute_policy_loss(micro.old_logprobs, logp, micro.advantages, mask, clip_ratio_low=0.2,
                                    clip_ratio_high=0.28, clip_ratio_c=3.0, **counts)
        kl = agg_loss(kl_penalty(logp, ref, "low_var_kl"), mask, "token-mean", **counts)
        w = inv.LossWitness(cfg, horizon=r)
        w._compare(pg + sign * 0.1 * kl, SimpleNamespace(stats={}), micro, logp, torch.zeros_like(logp), None,
                   counts, micro.old_logprobs)
        return w.metrics()["training/loss_witness_err"]

    assert err(1e-4, 1.0) < 1e-6  # read ~1 before the rounding bound
    assert err(1e-2, 1.0) < 1e-6
    assert err(1e-2, -1.0) > 1.0  # a KL of the wrong sign: the gap is twice the term itself

"""Mechanics invariants: witnesses that re-derive what one layer of a step should have produced and log the gap.

Each witness is computed apart from the code it checks, from that code's inputs and the config, with its
own small formula, so that a bug in the checked code does not also corrupt its witness:

| layer | witness | metric(s) | clean value |
|---|---|---|---|
| reward | known answers (right, wrong, malformed, sign, spacing, several answers, boxed / unboxed ...) for each reward type the run's data uses, scored by the run's reward function before training | `training/reward_audit_failures` | 0 |
| reward | each response decoded again and scored against its prompt's own dataset row (not the batch's copy), overlong shaping re-derived, vs the step's scores | `training/reward_rescore_max_abs_diff` | 0 |
| data | which dataset rows each step drew (row ids from the dataset, epochs of `N // batch` batches counted here) | `training/data_repeats_in_epoch`, `training/data_epoch_err` | 0 |
| generation | each row ends at its first stop token or at max length, its finish reason says which, its mask covers exactly those tokens | `training/gen_stop_violations` | 0 |
| optimizer | the AdamW update the config implies (lr with warmup, betas, eps, decoupled weight decay) from the step's gradients and the optimizer's moments before the step, in float64, vs the parameter change measured (sampled elements of every tensor); optimizer steps per update; gradients zero at each mini-batch's start; the post-clip norm | `training/optimizer_update_err`, `training/optimizer_steps_err`, `training/grad_stale_max`, `training/grad_clip_err` | see docs/metrics.md |
| loss | the clipped objective, KL term (configured estimator, sign and anchor), entropy bonus and MoE aux term re-derived in float64 from the micro-batch's tensors, vs the loss back-propagated (the gap beyond float32 rounding, relative to the terms' magnitudes) and the clip fraction logged; also on a probe (old and reference log-probs moved off the policy, advantages of both signs, so that clipping and KL are live) | `training/loss_witness_err`, `training/clipfrac_witness_err` | 0 to ~1e-7, 0 |

Tolerances and why: docs/metrics.md ("Mechanics invariants").
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace
from typing import Any

import numpy as np
import torch

# ----------------------------------------------------------------------------------------------- reward audit

# Known answers per reward type: (response, expected score). `{gt}` is a ground truth of the audit (an integer,
# so that every scorer reads it), `{wrong}` another one, `{neg}` the ground truth with its sign flipped.
_ARITH = [
    ("{gt}", 1.0), ("The answer is {gt}.", 1.0), ("  {gt}  \n", 1.0), ("\\boxed{{{gt}}}", 1.0),
    ("Answer: **{gt}**!", 1.0), ("{wrong} then {gt}", 1.0), ("{gt} then {wrong}", 0.0), ("{wrong}", 0.0),
    ("{neg}", 0.0), ("", 0.0), ("no number here", 0.0), ("{gt}.5", 0.0), ("{gt}.0", 1.0),
]
_DAPO = [
    ("Answer: {gt}", 1.0), ("reasoning\nAnswer: {gt}", 1.0), ("Answer:   {gt}  ", 1.0), ("answer: {gt}", 1.0),
    ("Answer: {wrong}\nAnswer: {gt}", 1.0), ("Answer: {gt}\nAnswer: {wrong}", -1.0), ("Answer: {wrong}", -1.0),
    ("Answer: {neg}", -1.0), ("{gt}", -1.0), ("", -1.0), ("Answer: \\boxed{{{gt}}}", 1.0),
]
_RETOOL = [  # strict box; a wrong answer's shaping needs num_turns, absent here, so it stays -1
    ("\\boxed{{{gt}}}", 1.0), ("so \\boxed{{ {gt} }}", 1.0), ("\\boxed{{{wrong}}} \\boxed{{{gt}}}", 1.0),
    ("\\boxed{{{gt}}} \\boxed{{{wrong}}}", -1.0), ("\\boxed{{{wrong}}}", -1.0), ("\\boxed{{{neg}}}", -1.0),
    ("{gt}", -1.0), ("Answer: {gt}", -1.0), ("", -1.0),
]
_GSM8K = [
    ("#### {gt}", 1.0), ("so\n#### {gt}", 1.0), ("#### {wrong}", 0.0), ("#### {neg}", 0.0), ("{gt}", 0.0), ("", 0.0),
]
_MATH = [
    ("\\boxed{{{gt}}}", 1.0), ("so $\\boxed{{{gt}}}$.", 1.0), ("\\boxed{{{wrong}}}", 0.0), ("\\boxed{{{neg}}}", 0.0),
    ("", 0.0),
]
_GEO3K = [  # 0.9 accuracy + 0.1 format (<think>...</think> then a box)
    ("<think>x</think>\\boxed{{{gt}}}", 1.0), ("<think>x</think>\\boxed{{{wrong}}}", 0.1), ("\\boxed{{{gt}}}", 0.9),
    ("", 0.0),
]
# data_source -> (kind, cases); the prefix rule `aime*` is the DAPO scorer's.
AUDIT_CASES: dict[str, tuple[str, list[tuple[str, float]]]] = {
    **{ds: ("arithmetic", _ARITH) for ds in ("synthetic/arithmetic", "synthetic/geometry")},
    **{ds: ("dapo", _DAPO) for ds in ("math_dapo", "dapo", "aime-2024", "aime2024")},
    "retool": ("retool", _RETOOL),
    **{ds: ("gsm8k", _GSM8K) for ds in ("openai/gsm8k", "gsm8k")},
    **{ds: ("math", _MATH) for ds in ("lighteval/MATH", "DigitalLearningGMU/MATH-lighteval",
                                      "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math")},
    **{ds: ("geo3k", _GEO3K) for ds in ("hiyouga/geometry3k", "geo3k")},
}
_AUDIT_TRUTHS = (("17", "23", "-17"), ("-4", "9", "4"), ("1205", "1250", "-1205"))


def audit_cases(data_source: str) -> list[tuple[str, str, float]]:
    """`(response, ground truth, expected score)` for the reward type of `data_source` ([] when it has no table)."""
    table = AUDIT_CASES.get(data_source) or (AUDIT_CASES["dapo"] if data_source.startswith("aime") else None)
    if table is None:
        return []
    out = []
    for gt, wrong, neg in _AUDIT_TRUTHS:
        for text, want in table[1]:
            out.append((text.format(gt=gt, wrong=wrong, neg=neg), gt, want))
    return out


def reward_audit(data_sources: set[str], score_fn) -> tuple[int, int, list[str]]:
    """Score every known case of every reward type in `data_sources` with `score_fn(ds, text, gt)` (the run's
    reward); `(cases, failures, descriptions of the failures)`. A data_source without a table counts as one
    failure (the audit cannot vouch for it)."""
    cases = failures = 0
    bad: list[str] = []
    for ds in sorted(data_sources):
        table = audit_cases(ds)
        if not table:
            failures += 1
            bad.append(f"{ds}: no known-answer table")
            continue
        for text, gt, want in table:
            cases += 1
            try:
                got = float(score_fn(ds, text, gt))
            except Exception as exc:  # noqa: BLE001 -- a scorer that raises on an input is a failed case
                got = float("nan")
                bad.append(f"{ds}: {text!r} vs {gt}: raised {type(exc).__name__}")
            if not abs(got - want) <= 1e-6:
                failures += 1
                bad.append(f"{ds}: {text!r} vs {gt}: {got} (expected {want})")
    return cases, failures, bad


# ----------------------------------------------------------------------------------------------- data / generation / rescore


class DataWitness:
    """Which dataset rows each step drew: repeats within an epoch of `N // batch_size` batches (counted here,
    not by the sampler), and the sampler's epoch against the one counted here."""

    def __init__(self, num_items: int, batch_size: int, *, epoch: int = 0, position: int = 0):
        self.per_epoch = max(1, num_items // batch_size)
        self.epoch = epoch
        self.batches = position // batch_size  # batches already drawn in this epoch (a resume)
        self.seen: set[Any] = set()

    def record(self, rows: list[Any]) -> dict[str, float]:
        """`rows`: the dataset row ids of one draw of `batch_size` prompts."""
        if self.batches >= self.per_epoch:
            self.epoch += 1
            self.batches = 0
            self.seen = set()
        self.batches += 1
        repeats = len(rows) - len(set(rows)) + len(set(rows) & self.seen)
        self.seen |= set(rows)
        return {"training/data_repeats_in_epoch": float(repeats)}


def generation_violations(responses: torch.Tensor, response_mask: torch.Tensor, finish: list[str] | None,
                          stop_ids: list[int], max_len: int) -> int:
    """Rows that break the stop rules: a stop token before the last token, a row without a final stop token
    shorter than `max_len`, a finish reason that disagrees, or a mask that is not exactly the first L tokens
    (L = the row's length by these rules)."""
    stops = {int(s) for s in stop_ids}
    bad = 0
    toks = responses.tolist()
    mask = response_mask.tolist()
    for i, (row, m) in enumerate(zip(toks, mask)):
        n = round(sum(m))
        first = next((j for j, t in enumerate(row[:max_len]) if t in stops), None)
        length = first + 1 if first is not None and first < n else n  # a stop inside the masked part ends it
        ends_on_stop = n > 0 and row[n - 1] in stops
        ok = (length == n and n <= max_len and (ends_on_stop or n == max_len)
              and all(v == 1.0 for v in m[:n]) and all(v == 0.0 for v in m[n:]))
        if finish is not None and ok:
            ok = finish[i] == ("stop" if ends_on_stop else "length")
        bad += not ok
    return bad


def rescore(batch, items: list[dict[str, Any]] | None, tokenizer, cfg, score_fn) -> float:
    """max |step score - score again|: each response's masked tokens decoded one by one, scored with
    `score_fn(ds, text, gt, extra)` against its prompt's own item (when `items` is the draw the batch came
    from), DAPO overlong shaping re-derived from the mask length. NaN when the batch has no scores."""
    if batch.scores is None:
        return float("nan")
    pad = tokenizer.pad_token_id
    worst = 0.0
    ob = cfg.algorithm.overlong_buffer
    for i in range(len(batch)):
        m = batch.response_mask[i] > 0
        ids = batch.responses[i].masked_fill(~m, pad).tolist()
        text = tokenizer.decode(ids, skip_special_tokens=True)
        if items is not None:
            item = items[int(batch.group_index[i])]
            ds, gt = item["data_source"], item["ground_truth"]
        else:
            ds, gt = batch.meta["data_source"][i], batch.meta["ground_truth"][i]
        s = float(score_fn(ds, text, gt, batch.meta["extra_info"][i]))
        if ob.enable:
            over = float(m.sum()) - (cfg.data.max_response_length - ob.len)
            s += min(0.0, -over / ob.len * ob.penalty_factor)
        worst = max(worst, abs(s - float(batch.scores[i])))
    return worst


# ----------------------------------------------------------------------------------------------- optimizer


def _sample_index(numel: int, k: int = 64) -> torch.Tensor:
    return torch.arange(0, numel, max(1, numel // k))[:k]


class OptimizerWitness:
    """Step pre/post hooks on a `torch.optim.AdamW`: the expected update of sampled elements of every
    parameter from the configured rule, vs the change measured. One per actor."""

    def __init__(self, optimizer: torch.optim.Optimizer, cfg) -> None:
        self.cfg = cfg
        self.optimizer = optimizer
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.index = [_sample_index(p.numel()) for p in self.params]
        self._before: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]] = []
        self.reset()
        optimizer.register_step_pre_hook(self._pre)
        optimizer.register_step_post_hook(self._post)

    def reset(self) -> None:
        self.steps = 0
        self.update_err = 0.0
        self.stale = 0.0
        self.clip_err = 0.0

    def _flat(self, t: torch.Tensor) -> torch.Tensor:
        t = t.full_tensor() if hasattr(t, "full_tensor") else t
        return t.detach().reshape(-1)

    def _pre(self, optimizer, args, kwargs) -> None:
        self._before = []
        for j, (p, idx) in enumerate(zip(self.params, self.index)):
            if p.grad is None:
                continue
            st = optimizer.state.get(p, {})
            k = int(st["step"]) if "step" in st else 0
            m = self._flat(st["exp_avg"])[idx].double() if "exp_avg" in st else torch.zeros(len(idx), dtype=torch.float64)
            v = (self._flat(st["exp_avg_sq"])[idx].double() if "exp_avg_sq" in st
                 else torch.zeros(len(idx), dtype=torch.float64))
            self._before.append((j, self._flat(p)[idx].double().cpu(), self._flat(p.grad)[idx].double().cpu(),
                                 m.cpu(), v.cpu(), k))

    def _post(self, optimizer, args, kwargs) -> None:
        cfg = self.cfg
        b1, b2 = cfg.betas
        eps, wd = 1e-8, cfg.weight_decay
        self.steps += 1
        for j, p0, g, m0, v0, k in self._before:
            warm = min(1.0, (k + 1) / cfg.warmup_steps) if cfg.warmup_steps > 0 else 1.0
            lr = cfg.lr * warm
            t = k + 1
            m = b1 * m0 + (1 - b1) * g
            v = b2 * v0 + (1 - b2) * g * g
            step = lr / (1 - b1 ** t) * m / (v.sqrt() / math.sqrt(1 - b2 ** t) + eps)
            want = p0 * (1 - lr * wd) - step
            p = self.params[j]
            got = self._flat(p)[self.index[j]].double().cpu()
            ulp = torch.from_numpy(np.spacing(want.float().abs().numpy())).double()
            err = ((got - want).abs() / (2 * ulp + 1e-3 * step.abs() + 1e-30)).max().item()
            self.update_err = max(self.update_err, err)
        self._before = []

    def check_zero_grads(self) -> None:
        """Before a mini-batch's first backward: every sampled gradient element must be absent or 0."""
        for p, idx in zip(self.params, self.index):
            if p.grad is not None:
                self.stale = max(self.stale, self._flat(p.grad)[idx].abs().max().item())

    def check_clip(self, pre_norm: float) -> None:
        """After clipping: the gradient norm recomputed over every parameter vs min(pre, clip) (torch's rule
        scales by clip / (pre + 1e-6))."""
        if not math.isfinite(pre_norm):
            return
        sq = 0.0
        for p in self.params:
            if p.grad is not None:
                sq += float(torch.linalg.vector_norm(self._flat(p.grad).float())) ** 2
        want = pre_norm * min(1.0, self.cfg.grad_clip / (pre_norm + 1e-6))
        self.clip_err = max(self.clip_err, abs(math.sqrt(sq) - want) / max(want, 1e-12))

    def metrics(self, expected_steps: int) -> dict[str, float]:
        out = {"training/optimizer_update_err": self.update_err,
               "training/optimizer_steps_err": float(abs(self.steps - expected_steps)),
               "training/grad_stale_max": self.stale, "training/grad_clip_err": self.clip_err}
        self.reset()
        return out


# ----------------------------------------------------------------------------------------------- loss


def _agg(x: torch.Tensor, mask: torch.Tensor, mode: str, counts: dict[str, float], horizon: int) -> torch.Tensor:
    """float64 loss aggregation (the four modes of trainer/algorithms/aggregation.py, written again)."""
    x = torch.where(mask, x, torch.zeros_like(x))
    if mode == "token-mean":
        return x.sum() / max(counts["global_num_tokens"], 1.0)
    per_seq = x.sum(-1)
    n = mask.sum(-1).double()
    if mode == "seq-mean-token-mean":
        per_seq = torch.where(n > 0, per_seq / (n + 1e-8), torch.zeros_like(per_seq))
    total = per_seq.sum() / max(counts["global_num_seqs"], 1.0)
    return total / horizon if mode == "seq-mean-token-sum-norm" else total


def _kl(d: torch.Tensor, kind: str) -> torch.Tensor:
    base = kind.removesuffix("+")
    if base in ("k1", "kl"):
        return d
    if base == "abs":
        return d.abs()
    if base in ("k2", "mse"):
        return 0.5 * d * d
    log_r = (-d).clamp(-20.0, 20.0)  # k3 / low_var_kl: r - log r - 1 with r = pi_ref / pi
    return (log_r.exp() - log_r - 1.0).clamp(-10.0, 10.0)


_FP32_EPS = float(torch.finfo(torch.float32).eps)


def fp32_rounding(cfg, micro, scale: float, counts: dict[str, float], horizon: int) -> float:
    """An upper bound on how far a float32 loss may sit from its float64 re-derivation by rounding alone.

    Two parts: the float32 sums over the micro-batch's tokens, `eps * log2(tokens) * scale` (pairwise
    summation's bound, relative to the terms' magnitudes); and the k3 estimator's cancellation,
    `exp(-d) + d - 1` for `d` near 0 rounds to a few ulps of 1 per token whatever the KL's own size, so
    `4 * eps * |kl_loss_coef|` per token, aggregated like the loss. Without the second part a batch whose
    advantages are all zero and whose policy still equals the reference (the KL term ~1e-8, the loss
    nothing but that rounding) reads as a relative error of 1e-2 to 1."""
    mask = micro.response_mask.bool()
    tokens = max(int(mask.sum()), 2)
    bound = _FP32_EPS * math.log2(tokens) * scale
    if cfg.use_kl_loss and cfg.kl_loss_type.removesuffix("+") in ("k3", "low_var_kl"):
        units = torch.full(mask.shape, 4.0 * _FP32_EPS, dtype=torch.float64, device=mask.device)
        bound += abs(cfg.kl_loss_coef) * float(_agg(units, mask, cfg.loss_agg_mode, counts, horizon))
    return bound


def expected_loss(cfg, micro, logp: torch.Tensor, entropy: torch.Tensor, routed, counts: dict[str, float],
                  horizon: int, old: torch.Tensor) -> tuple[float, float, float]:
    """`(loss, scale, clipped tokens / global tokens)` the configured objective gives for one micro-batch:
    PPO clip (clip-higher, dual clip), TIS weights, KL to the reference with the configured estimator and
    sign, entropy bonus, MoE aux term; float64 after the fp32 ratio (so that the clip decisions are the same).
    `scale` is the sum of the terms' magnitudes, what a relative error is measured against."""
    mask = micro.response_mask.bool().to(logp.device)
    ratio = torch.exp((logp.detach().float() - old.float()).clamp(-20.0, 20.0)).double()
    a = micro.advantages.to(logp.device).double()
    l1 = -a * ratio
    l2 = -a * ratio.clamp(1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
    clipped = (l2 > l1) & mask
    pg = torch.maximum(l1, l2)
    if cfg.clip_ratio_c is not None:
        pg = torch.where(a < 0, torch.minimum(pg, -a * cfg.clip_ratio_c), pg)
    if cfg.tis_cap is not None:
        w = torch.exp((old.float() - micro.rollout_logprobs.to(logp.device).float()).clamp(-20.0, 20.0)).double()
        pg = pg * w.clamp(max=cfg.tis_cap)
    mode = cfg.loss_agg_mode
    total = _agg(pg, mask, mode, counts, horizon)
    scale = _agg(pg.abs(), mask, mode, counts, horizon)
    if cfg.use_kl_loss:
        kl = _kl(logp.detach().double() - micro.ref_logprobs.to(logp.device).double(), cfg.kl_loss_type)
        total = total + cfg.kl_loss_coef * _agg(kl, mask, mode, counts, horizon)
        scale = scale + abs(cfg.kl_loss_coef) * _agg(kl.abs(), mask, mode, counts, horizon)
    if cfg.entropy_coeff != 0:
        ent = _agg(entropy.detach().double(), mask, mode, counts, horizon)
        total = total - cfg.entropy_coeff * ent
        scale = scale + abs(cfg.entropy_coeff) * ent.abs()
    if routed is not None and cfg.moe_aux_loss_coeff > 0:
        share = float(micro.response_mask.sum()) / max(counts["global_num_tokens"], 1.0)
        aux = cfg.moe_aux_loss_coeff * share * float(routed[0].detach())
        total, scale = total + aux, scale + abs(aux)
    frac = float(clipped.sum()) / max(counts["global_num_tokens"], 1.0)
    return float(total), float(scale), frac


def probe_offsets(shape: tuple[int, int], amp: float, phase: float) -> torch.Tensor:
    """A fixed pattern in [-amp, amp] `[N, R]`: log-prob offsets that move ratios out of the trust region."""
    i = torch.arange(shape[0], dtype=torch.float32)[:, None]
    t = torch.arange(shape[1], dtype=torch.float32)[None, :]
    return amp * torch.sin(1.7 * i + 0.9 * t + phase)


class LossWitness:
    """Wraps a mini-batch's `loss_fn(micro, logp, entropy, routed) -> (loss, out)`: the loss and clip fraction
    it returns vs `expected_loss`, on the real micro-batch and (first micro-batch of each mini-batch) on a
    probe whose old and reference log-probs are moved off the policy by a fixed pattern and whose advantages
    are a fixed pattern of both signs (so that the clipped objective is live even on a batch where every
    group scored alike, e.g. a random-init model's)."""

    def __init__(self, cfg, horizon: int) -> None:
        self.cfg, self.horizon = cfg, horizon
        self.reset()

    def reset(self) -> None:
        self.loss_err = 0.0
        self.clip_err = 0.0

    def _compare(self, loss: torch.Tensor, out, micro, logp, entropy, routed, counts, old) -> None:
        want, scale, frac = expected_loss(self.cfg, micro, logp, entropy, routed, counts, self.horizon, old)
        beyond = abs(float(loss.detach()) - want) - fp32_rounding(self.cfg, micro, scale, counts, self.horizon)
        self.loss_err = max(self.loss_err, max(beyond, 0.0) / max(scale, 1e-12))
        got = out.stats.get("actor/pg_clipfrac")
        if got is not None:  # in tokens: clipped-token count / global tokens, times global tokens
            self.clip_err = max(self.clip_err, abs(float(got) - frac) * counts["global_num_tokens"])

    def wrap(self, loss_fn, probe_fn, counts: dict[str, float], reuse_forward_as_old: bool, on_first=None):
        first = [True]

        def wrapped(micro, logp, entropy, routed):
            if first[0] and on_first is not None:
                on_first()
            loss, out = loss_fn(micro, logp, entropy, routed)
            old = logp.detach() if reuse_forward_as_old else micro.old_logprobs.to(logp.device)
            self._compare(loss, out, micro, logp, entropy, routed, counts, old)
            if first[0]:
                lp = logp.detach()
                shape = tuple(lp.shape)
                probe = replace(micro, old_logprobs=lp + probe_offsets(shape, 0.6, 0.3).to(lp),
                                ref_logprobs=lp + probe_offsets(shape, 0.5, 1.9).to(lp),
                                advantages=probe_offsets(shape, 1.0, 0.7).to(lp))
                with torch.no_grad():
                    p_loss, p_out = probe_fn(probe, lp, entropy.detach(), routed)
                self._compare(p_loss, p_out, probe, lp, entropy, routed, counts, probe.old_logprobs)
            first[0] = False
            return loss, out

        return wrapped

    def metrics(self) -> dict[str, float]:
        out = {"training/loss_witness_err": self.loss_err, "training/clipfrac_witness_err": self.clip_err}
        self.reset()
        return out


class UpdateWitness:
    """The optimizer and loss witnesses of one actor, as `Actor.update` uses them."""

    def __init__(self, actor) -> None:
        self.actor = actor
        self.opt = OptimizerWitness(actor.optimizer, actor.cfg) if isinstance(actor.optimizer, torch.optim.AdamW) else None
        self.loss = LossWitness(actor.cfg, actor.max_response_length)

    def wrap(self, loss_fn, counts: dict[str, float], reuse_forward_as_old: bool):
        probe_fn = functools.partial(self.actor.micro_batch_loss, counts=counts, reuse_forward_as_old=False)
        return self.loss.wrap(loss_fn, probe_fn, counts, reuse_forward_as_old,
                              on_first=self.opt.check_zero_grads if self.opt is not None else None)

    def after_clip(self, grad_norm: torch.Tensor) -> None:
        if self.opt is not None:
            self.opt.check_clip(float(grad_norm))

    def metrics(self, batch_len: int, n: int, skipped: int) -> dict[str, float]:
        cfg = self.actor.cfg
        out = self.loss.metrics()
        if self.opt is not None:
            minis = -(-batch_len // (cfg.ppo_mini_batch_size * n))
            out.update(self.opt.metrics(cfg.ppo_epochs * minis - skipped))
        return out


# ----------------------------------------------------------------------------------------------- the step's driver side


def _score(ds: str, text: str, gt: Any, extra: dict | None = None) -> float:
    from trainer.rewards import compute_score

    return compute_score(ds, text, gt, extra).score


class StepWitness:
    """The reward, data and generation witnesses of a loop's steps (`begin_step`, `draw` as the items
    function, `metrics` on the scored batch)."""

    def __init__(self, cfg, tokenizer, eos_ids: list[int], train_data, val_data=None) -> None:
        self.cfg, self.tokenizer, self.eos_ids = cfg, tokenizer, list(eos_ids)
        self.train_data = train_data
        sources = {it["data_source"] for it in train_data.items} if train_data is not None else set()
        if val_data is not None:
            sources |= {it["data_source"] for it in val_data.items}
        if cfg.agent.enable:
            sources = {cfg.agent.data_source} if cfg.agent.data_source else sources
        self.audit_cases, self.audit_failures, self.audit_messages = reward_audit(sources, _score)
        st = train_data.state_dict() if train_data is not None else {"epoch": 0, "position": 0}
        self.data = (DataWitness(len(train_data), train_data.batch_size, epoch=int(st["epoch"]),
                                 position=int(st["position"])) if train_data is not None else None)
        self.draws: list[list[dict[str, Any]]] = []
        self.data_stats: dict[str, float] = {}

    def begin_step(self) -> None:
        self.draws = []
        self.data_stats = {}

    def draw(self, next_batch):
        """`next_batch` recording what it returned (the items function of `generate_scored_batch`)."""

        def items():
            got = next_batch()
            self.draws.append(got)
            if self.data is not None:
                stats = self.data.record([it.get("index") for it in got])
                self.data_stats["training/data_repeats_in_epoch"] = (
                    self.data_stats.get("training/data_repeats_in_epoch", 0.0) + stats["training/data_repeats_in_epoch"])
            return got

        return items

    def metrics(self, batch) -> dict[str, float]:
        cfg = self.cfg
        out = {"training/reward_audit_failures": float(self.audit_failures)}
        out.update(self.data_stats)
        if self.data is not None and self.draws:
            out["training/data_epoch_err"] = float(abs(self.train_data.epoch - self.data.epoch))
        items = self.draws[0] if len(self.draws) == 1 and not cfg.algorithm.dynamic_sampling else None
        out["training/reward_rescore_max_abs_diff"] = rescore(batch, items, self.tokenizer, cfg, _score)
        if not cfg.agent.enable:  # multi-turn rows hold several turns, each ending at a stop token
            out["training/gen_stop_violations"] = float(generation_violations(
                batch.responses, batch.response_mask, batch.meta.get("finish_reason"), self.eos_ids,
                cfg.data.max_response_length))
        return out


def witness_group(batch, item: dict[str, Any], tokenizer, cfg, eos_ids: list[int]) -> None:
    """Fully-async: the rollout worker's witnesses of one scored group, in its meta (`witness/*`, one value per
    row): the group's stop-rule violations on its first row, the rescore gap against the group's own item."""
    n = len(batch)
    diff = rescore(batch, [item], tokenizer, cfg, _score)
    batch.meta["witness/rescore"] = [diff] * n
    if not cfg.agent.enable:
        bad = generation_violations(batch.responses, batch.response_mask, batch.meta.get("finish_reason"), eos_ids,
                                    cfg.data.max_response_length)
        batch.meta["witness/gen"] = [float(bad)] + [0.0] * (n - 1)


_AUDITED: dict[str, int] = {}  # data_source -> failures of its known answers (this process)


def audit_failures(sources: set[str]) -> int:
    """The reward audit's failures over `sources`, each data_source audited once per process."""
    for ds in sources - set(_AUDITED):
        _AUDITED[ds] = reward_audit({ds}, _score)[1]
    return sum(_AUDITED[ds] for ds in sources)


def async_witness_metrics(batch) -> dict[str, float]:
    """Fully-async driver: the reward audit of every data_source the run has consumed so far, and the worst
    of the consumed groups' witnesses (`witness_group`)."""
    seen = _AUDITED.keys() | set(batch.meta.get("data_source", []))
    out = {"training/reward_audit_failures": float(audit_failures(set(seen)))}
    if "witness/rescore" in batch.meta:
        out["training/reward_rescore_max_abs_diff"] = max(batch.meta["witness/rescore"])
    if "witness/gen" in batch.meta:
        out["training/gen_stop_violations"] = float(sum(batch.meta["witness/gen"]))
    return out

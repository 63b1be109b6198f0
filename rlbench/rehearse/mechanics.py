"""The rehearsal's verdict: mechanics checks over a run's metrics.jsonl, never the published numbers.

Each check is evaluated at every training step it applies to and gives pass / fail / not evaluated with
the values it read. Bounds are for fp32 tiny models on CPU (clean rehearsals measure 1e-6-1e-5; a weight
sync that drops a tensor-parallel rank's shards measures > 1e-2, `rlbench/rehearse/faults.py`):

- steps: every training step 1..total_steps wrote its metrics line;
- update: `actor/grad_norm` > 0 at some step (the syncs then carry moved weights); not evaluated when every
  reward was equal (a random-init model often scores 0 everywhere: zero advantages, zero gradients);
- finite_losses: `actor/pg_loss` (and `actor/kl_loss`, `actor/moe/load_balancing_loss`, `critic/vf_loss` when
  logged) finite at every step;
- logprob_agreement: `training/rollout_probs_diff_max` <= PROBS_DIFF_MAX: the engine's probabilities of its
  sampled tokens vs the trainer's recomputation. Colocated: every step (each step samples with the weights
  just synced); fully-async: step 1 only (later batches may be sampled by older weights than the trainer's);
- weight_sync: colocated: the same agreement at the steps after a sync (2..N), and
  `training/weight_sync_max_abs_diff` == 0 where the loop logs it; fully-async:
  `fully_async/rollouter/replicas_out_of_sync` == 0 at every sync (several rollout replicas);
- on_policy_first_minibatch: |`actor/ppo_kl_first_minibatch`| <= FIRST_MINIBATCH_KL_MAX (colocated: every
  step; fully-async: step 1);
- moe_routing (mixture-of-experts models): `actor/moe/router_entropy` in (0, ln E], `actor/moe/expert_load/cv`
  finite and >= 0, `actor/moe/load_balancing_loss` finite, every step;
- agent_loop (profiles with tools): `num_turns/mean` logged every step (the multi-turn loop ran);
- images_in_rollout (profiles with images): `prompt_length/mean` above the text-only prompt (the image tokens
  reached the engine and the trainer); a run that stopped at start evaluates nothing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

PROBS_DIFF_MAX = 1e-3
FIRST_MINIBATCH_KL_MAX = 1e-4
WEIGHT_DIFF_MAX = 0.0


def read_metrics(path: Path) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            out.setdefault(int(rec["step"]), {}).update(rec["data"])
    return out


def _num(v: Any) -> float:
    return float(v) if not isinstance(v, str) else float(v)  # "nan" / "inf" strings parse as floats


def _check(name: str, rows: dict[int, dict[str, Any]], steps: list[int], metric: str, ok, what: str
           ) -> dict[str, Any]:
    vals = {s: rows[s][metric] for s in steps if metric in rows.get(s, {})}
    if not vals:
        return {"check": name, "result": "fail", "detail": f"{metric} not logged at steps {steps}"}
    bad = {s: v for s, v in vals.items() if not ok(_num(v))}
    missing = [s for s in steps if s not in vals]
    if bad or missing:
        detail = f"{metric} {what}: " + (f"violated at {bad}" if bad else "") + (f" missing at {missing}" if missing else "")
        return {"check": name, "result": "fail", "detail": detail}
    worst = max(vals.values(), key=lambda v: abs(_num(v)))
    return {"check": name, "result": "pass", "detail": f"{metric} {what} at steps {sorted(vals)} (worst {_num(worst):.3g})"}


def evaluate_mechanics(rows: dict[int, dict[str, Any]], *, total_steps: int, mode: str, moe_experts: int = 0,
                       agent: bool = False, images: bool = False) -> list[dict[str, Any]]:
    steps = list(range(1, total_steps + 1))
    done = [s for s in steps if s in rows]
    out: list[dict[str, Any]] = [{"check": "steps", "result": "pass" if done == steps else "fail",
                                  "detail": f"{len(done)} of {total_steps} training steps logged"}]
    if not done:
        return out
    finite = lambda v: math.isfinite(v)  # noqa: E731
    out.append(_check("finite_losses", rows, done, "actor/pg_loss", finite, "finite"))
    for extra in ("actor/kl_loss", "actor/moe/load_balancing_loss", "critic/vf_loss"):
        if any(extra in rows[s] for s in done):
            out.append(_check(f"finite_losses:{extra}", rows, done, extra, finite, "finite"))
    grads = {s: _num(rows[s]["actor/grad_norm"]) for s in done if "actor/grad_norm" in rows[s]}
    spread = any(_num(rows[s].get("critic/score/max", 0)) != _num(rows[s].get("critic/score/min", 0)) for s in done)
    if any(g > 0 and math.isfinite(g) for g in grads.values()):
        out.append({"check": "update", "result": "pass", "detail": f"actor/grad_norm > 0 at steps "
                    f"{sorted(s for s, g in grads.items() if g > 0)}: the updates moved the weights the syncs send"})
    elif not spread:
        out.append({"check": "update", "result": "not evaluated", "detail": "every reward of every step was equal "
                    "(a random-init model), so GRPO's advantages and gradients were 0: the syncs sent unchanged weights"})
    else:
        out.append({"check": "update", "result": "fail", "detail": f"rewards differed but actor/grad_norm was {grads}"})
    colocated = mode == "colocated"
    on_policy = done if colocated else done[:1]
    out.append(_check("logprob_agreement", rows, on_policy, "training/rollout_probs_diff_max",
                      lambda v: 0 <= v <= PROBS_DIFF_MAX, f"<= {PROBS_DIFF_MAX:g}"))
    if colocated:
        after_sync = [s for s in done if s >= 2]
        if after_sync:
            out.append(_check("weight_sync", rows, after_sync, "training/rollout_probs_diff_max",
                              lambda v: 0 <= v <= PROBS_DIFF_MAX, f"<= {PROBS_DIFF_MAX:g} after a sync"))
        if any("training/weight_sync_max_abs_diff" in rows[s] for s in done):
            out.append(_check("weight_sync:max_abs_diff", rows, done, "training/weight_sync_max_abs_diff",
                              lambda v: v <= WEIGHT_DIFF_MAX, "== 0"))
    else:
        key = "fully_async/rollouter/replicas_out_of_sync"
        logged = [s for s in done if key in rows[s]]
        if logged:
            out.append(_check("weight_sync", rows, logged, key, lambda v: v == 0, "== 0"))
        else:
            out.append({"check": "weight_sync", "result": "not evaluated",
                        "detail": f"{key} not logged (one rollout replica, or no sync reached)"})
    out.append(_check("on_policy_first_minibatch", rows, on_policy, "actor/ppo_kl_first_minibatch",
                      lambda v: abs(v) <= FIRST_MINIBATCH_KL_MAX, f"|x| <= {FIRST_MINIBATCH_KL_MAX:g}"))
    if moe_experts > 1:
        ln_e = math.log(moe_experts) + 1e-6
        out.append(_check("moe_routing:router_entropy", rows, done, "actor/moe/router_entropy",
                          lambda v: 0 < v <= ln_e, f"in (0, ln {moe_experts}]"))
        out.append(_check("moe_routing:expert_load_cv", rows, done, "actor/moe/expert_load/cv",
                          lambda v: math.isfinite(v) and v >= 0, "finite, >= 0"))
    if agent:
        out.append(_check("agent_loop", rows, done, "num_turns/mean", lambda v: v >= 1, ">= 1 (the multi-turn loop ran)"))
    if images:
        out.append(_check("images_in_rollout", rows, done, "prompt_length/mean", lambda v: v > 0, "logged"))
    return out

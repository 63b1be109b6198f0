"""The one metric vocabulary of rlbench: verl's metric names, and how other logs map onto them.

Every log rlbench reads (verl's file logger and console, Miles/slime logs, the trainer's own
`metrics.jsonl`) is translated to verl's names before checks see it, so a suite checks
`actor/ppo_kl` whatever framework produced the run.

Three tables, all applied by `canonical_name(name, source)`:

- `MILES_EXACT`: Miles (and slime, which Miles forked) names that have a verl equivalent.
  Names come from Miles' own logging: the rollout manager logs `rollout/*` and `perf/*` keyed by
  `rollout/step`, the Megatron actor logs `train/*` keyed by `train/step`, evaluation logs
  `eval/<dataset>*` keyed by `eval/step`, and the timers log `perf/<timer>_time`.
- `MILES_PATTERNS`: the per-dataset evaluation names (`eval/<ds>`, `eval/<ds>-pass@k`, ...).
- `VERL_LEGACY_PATTERNS`: names older verl releases used, applied to every source.

A name in none of the tables is kept as it is (it is already canonical, or has no verl
equivalent, e.g. Miles' `perf/actor_train_tok_per_s`). `mapping_table()` returns every rule as
rows for the documentation.

Known departures:
- Miles' `train/*` metrics are keyed by the optimizer step and `rollout/*`/`perf/*` by the rollout
  id; they coincide when one rollout feeds one optimizer step (`num_steps_per_rollout == 1`, the
  published configurations) and rlbench does not try to re-align them otherwise.
- Miles' `eval/<ds>` is the mean reward over evaluation samples; it maps to `acc/mean@1` as the
  Miles article reads it (accuracy), which holds for 0/1 rewards.

Reward is not accuracy. verl logs `val-core/<ds>/reward/mean@N`, the mean validation reward,
and `val-core/<ds>/acc/mean@N` only when the reward function returns an `acc`; with +-1 rewards
(DAPO's math reward) a mean reward of 0.5 is an accuracy of 0.75. So the mean reward keeps its
name (and verl's oldest `val/test_score/<ds>`, the same mean score, becomes
`val-core/<ds>/reward/mean@1`). It is read as the accuracy only when the user says the rewards
are 0/1 per sample (`rlbench check --reward-is-accuracy`, `load_metrics(reward_is_accuracy=True)`,
see `accuracy_twin`), and then only where the log has no accuracy of its own and every value,
and the training `critic/score/min`/`max`, stays in [0, 1].

Scaled names: verl's older releases logged `critic/lr(1e-4)` = lr x 1e4 (the number in the
parentheses is the unit); `canonical_name_and_scale` returns `critic/lr` and the factor 1e-4.
"""

from __future__ import annotations

import re
from functools import lru_cache

# Miles/slime name -> verl name. Comments say what the Miles metric measures.
MILES_EXACT: dict[str, str] = {
    # --- per-step wall time (seconds); Miles' Timer logs `perf/<timer>_time` ---
    "perf/step_time": "timing_s/step",  # whole rollout+train iteration
    "perf/rollout_time": "timing_s/gen",  # generation of the rollout batch (SGLang)
    "perf/actor_train_time": "timing_s/update_actor",  # Megatron forward/backward/optimizer
    "perf/update_weights_time": "timing_s/update_weights",  # push of new weights to the engines
    "perf/log_probs_time": "timing_s/old_log_prob",  # recompute of old log-probs by the actor
    "perf/ref_log_probs_time": "timing_s/ref",  # reference-model log-probs
    # --- throughput ---
    "perf/tokens_per_gpu_per_sec": "perf/throughput",  # response tokens / rollout time / rollout GPUs
    "perf/actor_train_tok_per_s": "perf/actor_train_tok_per_s",  # no verl equivalent; kept
    "perf/actor_train_mfu": "perf/mfu/actor",  # model FLOPs utilisation of the training step
    # --- policy update (Megatron actor, keyed by train/step) ---
    "train/ppo_kl": "actor/ppo_kl",  # mean(logp_old - logp) over response tokens
    "train/pg_clipfrac": "actor/pg_clipfrac",  # fraction of tokens whose ratio was clipped
    "train/pg_loss": "actor/pg_loss",  # policy-gradient loss
    "train/entropy_loss": "actor/entropy",  # mean token entropy (logged as a loss term)
    "train/kl_loss": "actor/kl_loss",  # KL(actor || ref) loss term
    "train/grad_norm": "actor/grad_norm",  # gradient norm before clipping
    "train/lr-pg_0": "actor/lr",  # learning rate of the first parameter group
    # --- rollout batch (keyed by rollout/step) ---
    "rollout/raw_reward": "critic/score/mean",  # mean task reward before normalisation
    "rollout/episode_raw_reward": "critic/score/mean",  # newer Miles: the same, averaged per rollout
    "rollout/response_lengths": "response_length/mean",  # older slime/Miles: mean response tokens
    "rollout/response_len/mean": "response_length/mean",  # newer Miles statistics of response tokens
    "rollout/response_len/max": "response_length/max",
    "rollout/response_len/min": "response_length/min",
    "rollout/truncated_ratio": "response_length/clip_ratio",  # fraction of responses cut at the cap
}

# Miles evaluation names, per dataset <ds> (a name without "/"), tried in order.
MILES_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # pass@k over n samples per prompt: kept as pass@k
    (re.compile(r"^eval/(?P<ds>[^/]+)-pass@(?P<k>\d+)$"), "val-core/{ds}/acc/pass@{k}"),
    # fraction of evaluation responses that hit the length cap
    (re.compile(r"^eval/(?P<ds>[^/]+)-truncated_ratio$"), "val-aux/{ds}/truncated_ratio"),
    # fraction of evaluation samples whose reward is missing (errored trials)
    (re.compile(r"^eval/(?P<ds>[^/]+)-none_reward_ratio$"), "val-aux/{ds}/none_reward_ratio"),
    # per-sample statistics, e.g. eval/aime/response_len/mean
    (re.compile(r"^eval/(?P<ds>[^/]+)/(?P<rest>.+)$"), "val-aux/{ds}/{rest}"),
    # mean reward over evaluation samples = accuracy at 1 sample for 0/1 rewards
    (re.compile(r"^eval/(?P<ds>[^/]+)$"), "val-core/{ds}/acc/mean@1"),
]

# Names of older verl releases (its quickstart prints them), applied to every source.
VERL_LEGACY_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # verl < 0.3 logged one validation score (mean reward) per data source
    (re.compile(r"^val/test_score/(?P<ds>.+)$"), "val-core/{ds}/reward/mean@1"),
    # verl < 0.3 timed phases under "timing/" (seconds), now "timing_s/"
    (re.compile(r"^timing/(?P<phase>.+)$"), "timing_s/{phase}"),
    # verl < 0.3 logged the mean token entropy as "actor/entropy_loss"
    (re.compile(r"^actor/entropy_loss$"), "actor/entropy"),
]

# "name(1e-4)": the value is in units of 1e-4 (verl's old `critic/lr(1e-4)` logged lr x 1e4).
_SCALED = re.compile(r"^(?P<base>.+)\((?P<unit>1e-?\d+)\)$")
_REWARD_MEAN = re.compile(r"^val-core/(?P<ds>.+)/reward/(?P<stat>mean|best|worst|maj)@(?P<rest>.+)$")

# Keys that carry the step, not a metric. Miles logs a separate step key per metric family.
STEP_KEYS: tuple[str, ...] = ("step", "rollout/step", "train/step", "eval/step")

# Miles prefixes a role tag to actor metrics in some versions ("train/actor-ppo_kl").
_MILES_ROLE_TAG = re.compile(r"^train/actor-")

SOURCES: tuple[str, ...] = ("verl", "miles", "rlbench")


def _apply_patterns(name: str, patterns: list[tuple[re.Pattern[str], str]]) -> str | None:
    for pattern, template in patterns:
        m = pattern.match(name)
        if m:
            return template.format(**m.groupdict())
    return None


@lru_cache(maxsize=65536)
def canonical_name_and_scale(name: str, source: str = "verl") -> tuple[str, float]:
    """(verl name, factor to multiply the logged values by) of metric `name` logged by `source`."""
    m = _SCALED.match(name)
    if m:
        return canonical_name(m.group("base"), source), float(m.group("unit"))
    return canonical_name(name, source), 1.0


def accuracy_twin(name: str) -> str | None:
    """`val-core/<ds>/acc/<stat>@N` for a validation mean-reward name, else None (see module doc)."""
    m = _REWARD_MEAN.match(name)
    return f"val-core/{m.group('ds')}/acc/{m.group('stat')}@{m.group('rest')}" if m else None


@lru_cache(maxsize=65536)
def canonical_name(name: str, source: str = "verl") -> str:
    """Return the verl name for metric `name` logged by `source` ("verl", "miles", "rlbench").

    Unknown names are returned unchanged.
    """
    if source not in SOURCES:
        raise ValueError(f"unknown metric source {source!r}; expected one of {SOURCES}")
    if source == "miles":
        name = _MILES_ROLE_TAG.sub("train/", name)
        if name in MILES_EXACT:
            return MILES_EXACT[name]
        mapped = _apply_patterns(name, MILES_PATTERNS)
        if mapped is not None:
            return mapped
    legacy = _apply_patterns(name, VERL_LEGACY_PATTERNS)
    return legacy if legacy is not None else name


def mapping_table() -> list[dict[str, str]]:
    """Every mapping rule as rows {source, name, canonical}, for the documentation."""
    rows = [{"source": "miles", "name": k, "canonical": v} for k, v in MILES_EXACT.items()]
    rows.append({"source": "miles", "name": "train/actor-<name>", "canonical": "as train/<name>"})
    for pattern, template in MILES_PATTERNS:
        rows.append({"source": "miles", "name": pattern.pattern, "canonical": template})
    for pattern, template in VERL_LEGACY_PATTERNS:
        rows.append({"source": "verl (older releases)", "name": pattern.pattern, "canonical": template})
    rows.append({"source": "verl (older releases)", "name": "<name>(1e-4)",
                 "canonical": "<name>, value x 1e-4 (e.g. critic/lr(1e-4) -> critic/lr)"})
    rows.append({"source": "any, with --reward-is-accuracy", "name": "val-core/<ds>/reward/mean@N",
                 "canonical": "also val-core/<ds>/acc/mean@N, when every value is in [0, 1]"})
    return rows

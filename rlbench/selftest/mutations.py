"""Named faults for `rlbench selftest`: one-line bugs planted in a scratch copy of the trainer.

Each mutation is an exact-match text replacement in one file of the `trainer` package. The
target text must occur exactly once in that file, or `apply_mutation` raises naming the mutation
and the file: when the code a mutation targets moves or changes, the selftest fails loudly
instead of silently running an unmutated trainer.

    from rlbench.selftest.mutations import MUTATIONS, copy_trainer, apply_mutation
    root = copy_trainer(Path(tmp))                 # tmp/trainer: a copy of the package
    apply_mutation(MUTATIONS["grpo_no_group_mean"], root)

The list covers the five places a trainer goes wrong: the algorithm (advantages, losses, KL,
old log-probs), the rollout (sampling and its log-probs), the weight sync, the data (masks,
ground truth) and the reward. `expect` says which signal should move; the selftest measures
which check actually caught it.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from trainer.errors import RLBenchError

TRAINER_DIR = Path(__file__).resolve().parents[2] / "trainer"
AREAS = ("algorithm", "rollout", "sync", "data", "reward", "optimizer")


class MutationError(RLBenchError):
    """A mutation's target text is not (exactly once) in its file."""


@dataclass(frozen=True)
class Mutation:
    name: str
    area: str  # one of AREAS
    file: str  # path inside the trainer package, e.g. "algorithms/advantages.py"
    old: str  # exact text, must occur once
    new: str
    what: str  # the bug, in words
    expect: str  # the signal that should move
    not_default: str = ""  # why `rlbench selftest` leaves it out unless named (a known blind spot)


_M = [
    Mutation("grpo_no_group_mean", "algorithm", "algorithms/advantages.py",
             "    adv = scores.float() - mean  # [N]\n", "    adv = scores.float()  # [N]\n",
             "GRPO advantage without subtracting the group mean (score / std)",
             "critic/advantages/group_mean_abs_max, actor/grad_norm"),
    Mutation("kl_wrong_sign", "algorithm", "backends/actor.py",
             "loss = loss + cfg.kl_loss_coef * kl\n", "loss = loss - cfg.kl_loss_coef * kl\n",
             "KL loss added with the wrong sign (pushes the policy away from the reference)",
             "training/loss_witness_err (the probe's reference log-probs differ from the policy's, so the KL term is live)"),
    Mutation("kl_against_old_policy", "algorithm", "backends/actor.py",
             "kl_penalty(logp, micro.ref_logprobs, cfg.kl_loss_type)",
             "kl_penalty(logp, micro.old_logprobs, cfg.kl_loss_type)",
             "KL loss against the old (rollout-time) policy instead of the frozen reference",
             "training/loss_witness_err (the probe's old and reference log-probs differ)"),
    Mutation("loss_agg_token_sum", "algorithm", "algorithms/aggregation.py",
             "        return masked_sum(loss_mat, mask) / denom\n", "        return masked_sum(loss_mat, mask)\n",
             "token-mean loss aggregation that never divides by the token count",
             "actor/grad_norm, actor/kl_loss"),
    Mutation("old_logprobs_after_update", "algorithm", "modes/colocated.py",
             "elif c.actor.is_on_policy(batch, n) and cfg.actor.tis_cap is None:",
             "elif cfg.actor.tis_cap is None:",
             "old log-probs taken from the update forward of every mini-batch, i.e. after the earlier "
             "mini-batches' optimizer steps",
             "training/rollout_probs_diff_max"),
    Mutation("old_logprobs_from_reference", "algorithm", "modes/colocated.py",
             "batch.old_logprobs = c.actor.compute_logprobs(batch)\n",
             "batch.old_logprobs = c.actor.compute_logprobs(batch, model=c.ref)\n",
             "old log-probs computed with the frozen reference model instead of the current policy",
             "actor/ppo_kl_first_minibatch, training/rollout_probs_diff_max",
             "shows from step 2 only (at step 1 the reference is the policy); run it with --steps 2 or more"),
    Mutation("trainer_logprobs_ignore_temperature", "algorithm", "ops/logprobs.py",
             "    if temperature != 1.0:\n        z.div_(temperature)\n",
             "    if temperature != 1.0:\n        pass\n",
             "trainer log-probs computed at temperature 1 while the rollout samples at another",
             "training/rollout_probs_diff_max"),
    Mutation("sampling_ignores_temperature", "rollout", "rollout/hf.py",
             "    scaled = logits.float() / params.temperature  # [B, V]\n",
             "    scaled = logits.float()  # [B, V]\n",
             "the rollout engine samples (and reports log-probs) at temperature 1",
             "training/rollout_probs_diff_max"),
    Mutation("rollout_logprobs_ignore_temperature", "rollout", "rollout/hf.py",
             "    logp = torch.log_softmax(scaled, dim=-1)  # [B, V]\n",
             "    logp = torch.log_softmax(logits.float(), dim=-1)  # [B, V]\n",
             "the rollout samples at the configured temperature but reports temperature-1 log-probs",
             "training/rollout_probs_diff_max"),
    Mutation("weights_never_synced", "sync", "modes/colocated.py",
             '            with timer("update_weights"):\n                c.engine.update_weights(c.actor.named_weights())\n',
             '            with timer("update_weights"):\n                pass\n',
             "the trained weights are never copied to the rollout engine",
             "training/weight_sync_max_abs_diff, training/rollout_probs_diff_max"),
    Mutation("sync_skips_embeddings", "sync", "rollout/base.py",
             "        if target.data_ptr() != tensor.data_ptr():\n",
             '        if target.data_ptr() != tensor.data_ptr() and "embed" not in name:\n',
             "the weight sync skips the (tied) embedding matrix",
             "training/weight_sync_max_abs_diff"),
    Mutation("response_mask_shifted", "data", "components/batch.py",
             "            response_mask[i, :len(resp)] = 1.0 if m is None",
             "            response_mask[i, 1:len(resp) + 1] = 1.0 if m is None",
             "response mask off by one token (skips the first response token, covers one pad token)",
             "training/rollout_probs_diff_max"),
    Mutation("ground_truth_shifted", "data", "modes/steps.py",
             'batch.meta = {k: [items[g][k] for g in rollout.group_index] for k in ("data_source", "ground_truth",',
             'batch.meta = {k: [items[(g + (k == "ground_truth")) % len(items)][k] for g in rollout.group_index] '
             'for k in ("data_source", "ground_truth",',
             "each response is scored against the ground truth of the next prompt",
             "val-core acc at step 0, critic/score/mean (golden, learning)"),
    Mutation("reward_negated", "reward", "modes/steps.py",
             "    scores = torch.tensor([r.score for r in results], dtype=torch.float32)\n",
             "    scores = torch.tensor([-r.score for r in results], dtype=torch.float32)\n",
             "the reward with the wrong sign (-1 for a right answer)",
             "critic/score/mean (band [0, 1], golden, learning)"),
    Mutation("arithmetic_first_number", "reward", "rewards/arithmetic.py",
             '    return re.sub(r"[\\s,]", "", found[-1])\n', '    return re.sub(r"[\\s,]", "", found[0])\n',
             "the arithmetic reward reads the first number of the response instead of the last",
             "training/reward_audit_failures ('23 then 17' against 17)"),
    Mutation("sampler_overlapping_batches", "data", "data/sampler.py",
             "        self.position += self.batch_size\n", "        self.position += self.batch_size // 2\n",
             "the sampler advances half a batch per draw: consecutive batches share half their prompts",
             "training/data_repeats_in_epoch",
             "shows from step 2 (the first draw has no earlier one to repeat); run it with --steps 2 or more"),
    Mutation("adam_betas_swapped", "optimizer", "backends/actor.py",
             "lr=cfg.lr, betas=cfg.betas,", "lr=cfg.lr, betas=cfg.betas[::-1],",
             "AdamW built with (beta2, beta1) instead of (beta1, beta2)",
             "training/optimizer_update_err"),
    Mutation("grads_not_zeroed", "optimizer", "backends/actor.py",
             "                self.optimizer.zero_grad(set_to_none=True)\n", "",
             "gradients are never zeroed between mini-batches (each step adds the earlier mini-batches' gradients)",
             "training/grad_stale_max (from the second mini-batch)"),
    Mutation("ppo_clip_pessimism_flipped", "algorithm", "algorithms/policy_loss.py",
             "    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)  # [N, R]\n",
             "    loss_ppo = torch.minimum(loss_unclipped, loss_clipped)  # [N, R]\n",
             "the clipped objective takes the optimistic (min) instead of the pessimistic (max) of the two terms",
             "training/loss_witness_err (the probe's ratios leave the trust region)"),
    Mutation("clipfrac_inverted", "algorithm", "algorithms/policy_loss.py",
             "    clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).float(), mask)\n",
             "    clipfrac = masked_mean(torch.lt(loss_clipped, loss_unclipped).float(), mask)\n",
             "the clip fraction counts the tokens where the unclipped term is active",
             "training/clipfrac_witness_err"),
    Mutation("stop_token_ignored", "rollout", "rollout/hf.py",
             "            done = stopped | (budget[alive] <= t + 1)", "            done = budget[alive] <= t + 1",
             "the hf engine records a stop token but keeps decoding to the length budget",
             "training/gen_stop_violations"),
]
MUTATIONS: dict[str, Mutation] = {m.name: m for m in _M}
DEFAULT_MUTATIONS: list[str] = [m.name for m in _M if not m.not_default]
assert len(MUTATIONS) == len(_M) and all(m.area in AREAS for m in _M)


def copy_trainer(dest: Path, rev: str | None = None) -> Path:
    """Copy the `trainer` package to `dest/trainer` (no caches): the working tree's, or with `rev` the one
    of that git commit (`git archive`); returns `dest`."""
    if rev is None:
        shutil.copytree(TRAINER_DIR, dest / "trainer", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        return dest
    archive = subprocess.run(["git", "-C", str(TRAINER_DIR.parent), "archive", "--format=tar", rev, "trainer"],
                             capture_output=True)
    if archive.returncode != 0:
        raise MutationError(f"--rev {rev}: git archive failed ({archive.stderr.decode().strip()}); give a commit "
                            "of this repository")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def trainer_digest(rev: str | None = None) -> str:
    """Hash of the trainer's sources (working tree, or the tree id of `rev`): a reused run is one of this trainer."""
    if rev is not None:
        out = subprocess.run(["git", "-C", str(TRAINER_DIR.parent), "rev-parse", f"{rev}:trainer"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise MutationError(f"--rev {rev}: no trainer/ in that commit ({out.stderr.strip()})")
        return out.stdout.strip()
    h = hashlib.sha256()
    for p in sorted(TRAINER_DIR.rglob("*.py")):
        h.update(p.relative_to(TRAINER_DIR).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def apply_mutation(mutation: Mutation, root: Path) -> None:
    """Replace `mutation.old` by `mutation.new` in `root/trainer/<file>`; raise unless it occurs exactly once."""
    path = root / "trainer" / mutation.file
    if not path.is_file():
        raise MutationError(f"mutation {mutation.name}: trainer/{mutation.file} does not exist; update "
                            "rlbench/selftest/mutations.py to the file's new place")
    text = path.read_text()
    count = text.count(mutation.old)
    if count != 1:
        raise MutationError(f"mutation {mutation.name}: its target text occurs {count} times in "
                            f"trainer/{mutation.file} (must be exactly once): the code moved or changed; "
                            f"update the mutation's `old` text in rlbench/selftest/mutations.py ({mutation.old.strip()[:60]!r})")
    path.write_text(text.replace(mutation.old, mutation.new))


def check_targets() -> list[str]:
    """Problems with every mutation's target in the current trainer (empty when all apply)."""
    problems = []
    for m in _M:
        path = TRAINER_DIR / m.file
        count = path.read_text().count(m.old) if path.is_file() else -1
        if count != 1:
            problems.append(f"{m.name}: target text occurs {count} times in trainer/{m.file}")
    return problems

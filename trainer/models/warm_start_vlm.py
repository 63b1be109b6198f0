"""A brief supervised warm start of the tiny VLM on the synthetic figures, the stand-in for a pretrained VLM.

No small pretrained vision-language model ships in a Python package, and a random-init one almost
never answers a figure question with a number, so GRPO on it has no reward to learn from. This
trains `tiny:qwen2.5-vl` for a few supervised steps on the *training* split of a synthetic
geometry level: prompt = figure + question, target = the answer digits then ``<|im_end|>``, AdamW
at a constant learning rate, through the supervised loop, batches and cache of `trainer.models.warm_start`.
The vision tower stays at its random init here (the RL run may train it): a linear probe on its
mean merged features reads geometry-count's answer on every validation figure, and training it
alongside the text model (at lr 3e-3) kept the text model on the answer prior (loss ln 4 / 2 =
0.69 per token) for about 600 steps instead of 150. Its validation split (disjoint figures) is
never trained on.

Name: ``tiny:qwen2.5-vl+sft-geometry-<level>-<steps>[-to<pct>]``: at most `steps` steps; with
``-to<pct>`` it stops at the first check (every CHECK_EVERY steps, on CHECK_ROWS training rows)
whose *sampled* accuracy reaches pct percent: the mean probability that a temperature-1 response
is exactly the right answer and the end token, computed exactly from the log-probs (what a T = 1
rollout scores), so the model reads the figures only partly and RL has room. Greedy accuracy is
no stopping rule: it jumps between checks (0.19 -> 0.55 -> 0.19 at lr 1e-3) and reads a
near-uniform policy as a good one (the recipe before this one stopped at greedy 0.58 with every
answer at probability 0.22-0.28, so its T = 1 score was 0.26). What it bought is measured, not
assumed, and written to ``warm_start.json`` (steps run, the check curve, greedy and sampled
validation accuracy):

    python -m trainer.models.warm_start_vlm --task geometry-count --steps 400 --to 40
    # -> $RLBENCH_CACHE/models/tiny-qwen2.5-vl-sft-geometry-count-400-to40-r4/ (HF folder + warm_start.json)

Measured (2 CPU cores, torch 2.13): geometry-easy after 40 steps answers every figure with the
format right but the same number (greedy validation 0.375 = the most frequent answer's share):
format, no reading. geometry-count, lr 3e-3 (recipe 2): sampled accuracy 0.25-0.31 for 400 steps,
greedy 0.19-0.58: it hardly learns. lr 1e-3: near the answer prior (sampled 0.19-0.22) at steps
90-120, then 0.30 at step 130, 0.41 at 160, 0.58 at 190, 0.68 at 240 (greedy validation 0.94 there): it learns
to count. geometry-count-400-to40 (the geometry3k suite's cpu-vlm policy, recipe 4, float64): stopped
at step 150 (sampled check 0.45, after 0.39 at steps 130-140); on its 64 unseen validation rows
greedy 0.61 and sampled 0.42 against 0.27 for the most common answer; 38 s on 2 busy cores.
The tower's features carry the count: the text model learns to read them.

It trains in float64 and saves float64 weights (the RL run loads them at its own dtype): in float32
the curve is so steep near the stopping rule that the order of a sum decides where it stops.
Measured on one machine, geometry-count-400-to40 in float32 stopped at step 150 with one thread
and 170 with two (greedy validation 0.59 / 0.67); on another CPU it had stopped at 160, so the
cpu-vlm golden recorded there failed here. In float64 it stops at step 150 with one thread and
with two, the check curve equal to four decimals.

Configs name it ``model.path: "tiny:qwen2.5-vl+sft-geometry-count-400-to40"``: built on first use
(seconds on 2 idle CPU cores), then loaded from the cache.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

from trainer.errors import ModelError, RLBenchError

LR = 1e-3  # 3e-3 kept geometry-count's text model near the answer prior for 400 steps (sampled accuracy 0.25-0.31)
BATCH = 32
SEED = 1234  # the warm start's own seed, apart from the RL run's
CHECK_EVERY = 10  # steps between two checks of a -to<pct> warm start
CHECK_ROWS = 64  # training rows the check scores (the validation split stays unseen)
RECIPE = 4  # in the cache folder's name: 4 = tower frozen, lr 1e-3, -to<pct> reads the sampled accuracy, trained in float64


def parse_name(name: str) -> tuple[str, str, int, int | None]:
    """``qwen2.5-vl+sft-geometry-count-400-to40`` -> ("qwen2.5-vl", "geometry-count", 400, 40); no -to: None."""
    arch, _, rest = name.partition("+sft-")
    rest, _, to = rest.partition("-to") if "-to" in rest else (rest, "", "")
    task, _, steps = rest.rpartition("-")
    if (not task.startswith("geometry-") or not steps.isdigit() or int(steps) < 1
            or (to and not (to.isdigit() and 0 < int(to) <= 100))):
        raise ModelError(f"model.path: 'tiny:{name}' (fix: write tiny:{arch or 'qwen2.5-vl'}+sft-geometry-<level>-<steps>"
                         "[-to<pct>], e.g. tiny:qwen2.5-vl+sft-geometry-count-400-to40)")
    return arch, task, int(steps), (int(to) if to else None)


def folder_name(arch: str, task: str, steps: int, to: int | None) -> str:
    return f"tiny-{arch}-sft-{task}-{steps}" + (f"-to{to}" if to else "") + f"-r{RECIPE}"


def _batch(items: list[dict[str, Any]], targets: list[list[int]], pad: int):
    from trainer.models.warm_start import sft_batch

    batch = sft_batch([it["prompt_ids"] for it in items], targets, pad)
    batch.meta["multi_modal_inputs"] = [it["multi_modal_inputs"] for it in items]
    return batch


def warm_start(arch: str, task: str, steps: int, out: Path, to: int | None = None) -> dict[str, Any]:
    """Train and save the warm-started model to `out`; returns the provenance written to warm_start.json."""
    from trainer.data.dataset import PromptDataset
    from trainer.data.synthetic import ensure_synthetic
    from trainer.models.vlm import build_tiny_vlm, freeze_vision_tower, load_vision_processor
    from trainer.models.warm_start import supervised_steps

    t0 = time.perf_counter()
    model, tok = build_tiny_vlm(arch, dtype=torch.float64, attn_implementation="sdpa", seed=SEED, with_model=True)
    proc = load_vision_processor(f"tiny:{arch}", tok, model)
    train_rows, val_rows = ensure_synthetic(f"synthetic:{task}?num=512&num_val=64&seed={SEED}")
    train = PromptDataset(train_rows, tok, max_prompt_length=256, batch_size=BATCH, seed=SEED, processor=proc)
    check_rows = PromptDataset(train_rows[:CHECK_ROWS], tok, max_prompt_length=256, batch_size=CHECK_ROWS,
                               shuffle=False, processor=proc)
    val = PromptDataset(val_rows, tok, max_prompt_length=256, batch_size=64, shuffle=False, processor=proc)
    target = lambda it: tok.encode(it["ground_truth"]) + [tok.eos_token_id]

    freeze_vision_tower(model)
    curve: list[list[float]] = []

    def check(step: int, loss: float) -> bool:  # every CHECK_EVERY steps of a -to<pct> warm start: stop there?
        if to is None or step % CHECK_EVERY:
            return False
        acc = _sampled_accuracy(model, tok, check_rows, target)
        curve.append([step, round(acc, 4)])
        return acc * 100 >= to

    def next_batch() -> Any:
        items = train.next_batch()
        return _batch(items, [target(it) for it in items], tok.pad_token_id)

    losses = supervised_steps(model, next_batch, steps, LR, on_step=check)
    model.model.visual.requires_grad_(True)  # saved as an ordinary model: the RL config decides the tower
    val_acc = _greedy_accuracy(model, tok, val)
    val_sampled = _sampled_accuracy(model, tok, val, target)
    facts = {"arch": arch, "task": task, "steps": steps, "to_pct": to, "steps_run": len(losses), "seed": SEED,
             "lr": LR, "batch": BATCH, "vision_tower": "frozen (random init)", "loss_first": losses[0],
             "loss_last": losses[-1], "check_curve": curve, "val_acc_greedy": val_acc, "val_acc_sampled": val_sampled, "num_val": len(val),
             "val_answer_share_max": _majority_share(val_rows), "seconds": round(time.perf_counter() - t0, 1),
             "torch": torch.__version__}
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return facts


def _majority_share(rows: list[dict[str, Any]]) -> float:
    """The share of the most frequent answer: what always giving one answer scores."""
    from collections import Counter

    counts = Counter(r["reward_model"]["ground_truth"] for r in rows)
    return max(counts.values()) / len(rows)


@torch.no_grad()
def _sampled_accuracy(model: torch.nn.Module, tok: Any, rows: Any, target: Any) -> float:
    """Mean probability (temperature 1) that a sampled response is exactly the right answer and the end token:
    the accuracy a T = 1 rollout of these rows expects, exactly (the response has few tokens)."""
    from trainer.ops.logprobs import response_logprobs

    model.eval()
    probs = []
    for items in rows:
        batch = _batch(items, [target(it) for it in items], tok.pad_token_id)
        logp, _ = response_logprobs(model, batch)  # [B, R]
        probs += (logp * batch.response_mask).sum(-1).exp().tolist()
    return sum(probs) / len(probs)


@torch.no_grad()
def _greedy_accuracy(model: torch.nn.Module, tok: Any, val: Any) -> float:
    from trainer.models.specs import eos_token_ids
    from trainer.rewards import compute_score
    from trainer.rollout.base import SamplingParams
    from trainer.rollout.hf import HFRolloutEngine

    engine = HFRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=eos_token_ids(tok, model))
    correct = []
    for items in val:
        out = engine.generate([it["prompt_ids"] for it in items], SamplingParams(greedy=True, max_new_tokens=4),
                              multi_modal_inputs=[it["multi_modal_inputs"] for it in items])
        texts = tok.batch_decode(out.response_ids, skip_special_tokens=True)
        correct += [compute_score(it["data_source"], t, it["ground_truth"]).acc for it, t in zip(items, texts)]
    return sum(correct) / len(correct)


def load_warm_started(name: str, *, dtype: torch.dtype, attn_implementation: str) -> tuple[torch.nn.Module, Any]:
    """The cached warm-started model and tokenizer of ``tiny:<name>``, trained first when not cached."""
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    from trainer.models.specs import cache_dir
    from trainer.models.warm_start import build_cached

    arch, task, steps, to = parse_name(name)
    folder = cache_dir() / "models" / folder_name(arch, task, steps, to)
    build_cached(folder, lambda out: warm_start(arch, task, steps, out, to))
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=dtype, attn_implementation=attn_implementation)
    return model, AutoTokenizer.from_pretrained(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.models.warm_start_vlm", description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="qwen2.5-vl")
    parser.add_argument("--task", default="geometry-easy")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--to", type=int, default=None, help="stop at this sampled (T = 1) accuracy on training rows (percent)")
    args = parser.parse_args(argv)
    try:
        from trainer.models.specs import cache_dir

        name = f"{args.arch}+sft-{args.task}-{args.steps}" + (f"-to{args.to}" if args.to else "")
        arch, task, steps, to = parse_name(name)
        folder = cache_dir() / "models" / folder_name(arch, task, steps, to)
        if (folder / "warm_start.json").is_file():
            print(f"cached: {folder}\n{(folder / 'warm_start.json').read_text()}")
            return 0
        from trainer.models.warm_start import build_cached

        build_cached(folder, lambda out: warm_start(arch, task, steps, out, to))
        print((folder / "warm_start.json").read_text())
        print(f"wrote {folder}  (model.path: tiny:{name})")
    except RLBenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A brief supervised warm start of the tiny VLM on the synthetic figures, the stand-in for a pretrained VLM.

No small pretrained vision-language model ships in a Python package, and a random-init one almost
never answers a figure question with a number, so GRPO on it has no reward to learn from. This
trains `tiny:qwen2.5-vl` for a few supervised steps on the *training* split of a synthetic
geometry level: prompt = figure + question, target = the answer digits then ``<|im_end|>``, AdamW
at a constant learning rate, through the supervised loop, batches and cache of `trainer.warm_start`. The vision
tower stays at its random init here (the RL run may train it): a linear probe on its mean merged
features reads geometry-count's answer on every validation figure, and training it alongside
the text model kept the text model on the answer prior (loss ln 4 / 2 = 0.69 per token) for about
600 steps instead of 150. Its validation split (disjoint figures) is never trained on.

Name: ``tiny:qwen2.5-vl+sft-geometry-<level>-<steps>[-to<pct>]``: at most `steps` steps; with
``-to<pct>`` it stops at the first check (every CHECK_EVERY steps, greedy, on CHECK_ROWS training
rows) whose accuracy reaches pct percent, so the model reads the figures only partly and RL has
room: how long the text model stays on the answer prior before it starts to read varies with the
step count and the machine's arithmetic (e.g. 160 and 200 cosine-decayed steps never left it),
a stopping accuracy does not. What it bought is measured, not assumed, and written to
``warm_start.json`` (steps run, the check curve, greedy validation accuracy):

    python -m trainer.warm_start_vlm --task geometry-count --steps 600 --to 50
    # -> $RLBENCH_CACHE/models/tiny-qwen2.5-vl-sft-geometry-count-600-to50-r2/ (HF folder + warm_start.json)

Measured (2 CPU cores, torch 2.13): geometry-easy after 40 steps answers every figure with the
format right but the same number (greedy validation 0.375 = the most frequent answer's share):
format, no reading. geometry-count-600-to50 (the geometry3k suite's cpu-vlm policy): stopped at
step 140 (check 0.58 after 0.19-0.31 for 130 steps), greedy validation 0.52 on 64 unseen rows
against 0.27 for the most common answer, 227 s on the shared 2-core machine under load; -to80 never got there in 600
steps (checks 0.42-0.59, validation 0.39): this model does not learn to count fully.

Configs name it ``model.path: "tiny:qwen2.5-vl+sft-geometry-count-600-to50"``: built on first use
(under a minute on 2 CPU cores), then loaded from the cache.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

from trainer.errors import ModelError, RLBenchError

LR = 3e-3
BATCH = 32
SEED = 1234  # the warm start's own seed, apart from the RL run's
CHECK_EVERY = 10  # steps between two greedy accuracy checks of a -to<pct> warm start
CHECK_ROWS = 64  # training rows the check answers (the validation split stays unseen)
RECIPE = 2  # in the cache folder's name: 2 = tower frozen during the warm start, -to<pct> stops


def parse_name(name: str) -> tuple[str, str, int, int | None]:
    """``qwen2.5-vl+sft-geometry-count-600-to50`` -> ("qwen2.5-vl", "geometry-count", 600, 50); no -to: None."""
    arch, _, rest = name.partition("+sft-")
    rest, _, to = rest.partition("-to") if "-to" in rest else (rest, "", "")
    task, _, steps = rest.rpartition("-")
    if (not task.startswith("geometry-") or not steps.isdigit() or int(steps) < 1
            or (to and not (to.isdigit() and 0 < int(to) <= 100))):
        raise ModelError(f"model.path: 'tiny:{name}' (fix: write tiny:{arch or 'qwen2.5-vl'}+sft-geometry-<level>-<steps>"
                         "[-to<pct>], e.g. tiny:qwen2.5-vl+sft-geometry-count-600-to50)")
    return arch, task, int(steps), (int(to) if to else None)


def folder_name(arch: str, task: str, steps: int, to: int | None) -> str:
    return f"tiny-{arch}-sft-{task}-{steps}" + (f"-to{to}" if to else "") + f"-r{RECIPE}"


def _batch(items: list[dict[str, Any]], targets: list[list[int]], pad: int):
    from trainer.warm_start import sft_batch

    batch = sft_batch([it["prompt_ids"] for it in items], targets, pad)
    batch.meta["multi_modal_inputs"] = [it["multi_modal_inputs"] for it in items]
    return batch


def warm_start(arch: str, task: str, steps: int, out: Path, to: int | None = None) -> dict[str, Any]:
    """Train and save the warm-started model to `out`; returns the provenance written to warm_start.json."""
    from trainer.data.dataset import PromptDataset
    from trainer.data.synthetic import ensure_synthetic
    from trainer.models_vlm import build_tiny_vlm, freeze_vision_tower, load_vision_processor
    from trainer.warm_start import supervised_steps

    t0 = time.perf_counter()
    model, tok = build_tiny_vlm(arch, dtype=torch.float32, attn_implementation="sdpa", seed=SEED, with_model=True)
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
        acc = _greedy_accuracy(model, tok, check_rows)
        curve.append([step, round(acc, 4)])
        return acc * 100 >= to

    def next_batch() -> Any:
        items = train.next_batch()
        return _batch(items, [target(it) for it in items], tok.pad_token_id)

    losses = supervised_steps(model, next_batch, steps, LR, on_step=check)
    model.model.visual.requires_grad_(True)  # saved as an ordinary model: the RL config decides the tower
    val_acc = _greedy_accuracy(model, tok, val)
    facts = {"arch": arch, "task": task, "steps": steps, "to_pct": to, "steps_run": len(losses), "seed": SEED,
             "lr": LR, "batch": BATCH, "vision_tower": "frozen (random init)", "loss_first": losses[0],
             "loss_last": losses[-1], "check_curve": curve, "val_acc_greedy": val_acc, "num_val": len(val),
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
def _greedy_accuracy(model: torch.nn.Module, tok: Any, val: Any) -> float:
    from trainer.models import eos_token_ids
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

    from trainer.models import cache_dir
    from trainer.warm_start import build_cached

    arch, task, steps, to = parse_name(name)
    folder = cache_dir() / "models" / folder_name(arch, task, steps, to)
    build_cached(folder, lambda out: warm_start(arch, task, steps, out, to))
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=dtype, attn_implementation=attn_implementation)
    return model, AutoTokenizer.from_pretrained(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.warm_start_vlm", description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="qwen2.5-vl")
    parser.add_argument("--task", default="geometry-easy")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--to", type=int, default=None, help="stop at this greedy accuracy on training rows (percent)")
    args = parser.parse_args(argv)
    try:
        from trainer.models import cache_dir

        name = f"{args.arch}+sft-{args.task}-{args.steps}" + (f"-to{args.to}" if args.to else "")
        arch, task, steps, to = parse_name(name)
        folder = cache_dir() / "models" / folder_name(arch, task, steps, to)
        if (folder / "warm_start.json").is_file():
            print(f"cached: {folder}\n{(folder / 'warm_start.json').read_text()}")
            return 0
        from trainer.warm_start import build_cached

        build_cached(folder, lambda out: warm_start(arch, task, steps, out, to))
        print((folder / "warm_start.json").read_text())
        print(f"wrote {folder}  (model.path: tiny:{name})")
    except RLBenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

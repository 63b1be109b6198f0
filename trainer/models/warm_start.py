"""Supervised warm starts: a few SFT steps before RL, built once per setting and cached.

The published recipes start RL from a model that already has the habit RL sharpens (ReTool's
retool-SFT model calls the interpreter; a VLM reads figures). The models that run here on CPU do
not, so RL from them has no reward to learn from. A warm start trains the loaded model for a
few supervised steps on traces the project writes itself and caches the result:

- `model.warm_start` (a `WarmStartConfig`, any causal LM: the embedded SmolLM2, a tiny model, a
  local folder): ``data: tool-arithmetic`` trains on `trainer.data.tool_traces`: multi-digit
  arithmetic solved by a Miles-format ``<tool_call>`` to execute_python_code, the tool's output
  (masked out of the loss) and ``Answer: \\boxed{N}``, mixed with direct answers
  (`tool_fraction`). Few steps and a mix on purpose: the model calls the tool sometimes, not
  always and not always well, so the retool cpu profile can show RL raising the turns per
  trajectory and the reward;
- ``tiny:qwen2.5-vl+sft-geometry-<level>-<steps>`` (`trainer/models/warm_start_vlm.py`): the figures.

The loss is the mean negative log-prob of the mask-1 response tokens through the trainer's own
log-prob path (`trainer.ops.logprobs.response_logprobs`), AdamW, float32. A model folder with
``warm_start.json`` (the setting, the loss at the first and last step, the mean probability that
a response to a held-out prompt opens with a tool call, before and after, seconds, versions) lands under
``$RLBENCH_CACHE/models/<base>-sft-<hash of base and setting>/``; processes that need it at once
(Ray workers, the fully-async rollouter and trainer) wait on a file lock and one of them builds it.

    python -m trainer.models --steps 20 --tool-fraction 0.6     # build (or show) the cached model
    python -m trainer.models --steps 3 --tool-fraction 0.9 --batch-size 8 --lr 3e-4   # the retool cpu profile's

(`trainer/models/__main__.py`: it loads the base model through the loader, which stands above this module.)
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from trainer.config import ModelConfig, WarmStartConfig
from trainer.errors import ModelError


def sft_batch(prompts: Sequence[list[int]], responses: Sequence[list[int]], pad_token_id: int,
              masks: Sequence[list[int]] | None = None) -> Any:
    """A trainer `Batch` of fixed prompt/response pairs (mask 0 on tokens not trained on)."""
    from trainer.components.batch import batch_from_rollout
    from trainer.rollout.base import Rollout

    n = len(prompts)
    rollout = Rollout(prompt_ids=[list(p) for p in prompts], response_ids=[list(r) for r in responses],
                      response_logprobs=[[0.0] * len(r) for r in responses], finish_reasons=["stop"] * n,
                      group_index=list(range(n)), response_mask=[list(m) for m in masks] if masks else None)
    return batch_from_rollout(rollout, pad_token_id=pad_token_id)


def supervised_steps(model: torch.nn.Module, next_batch: Callable[[], Any], steps: int, lr: float,
                     on_step: Callable[[int, float], bool] | None = None) -> list[float]:
    """At most `steps` AdamW steps on the masked mean NLL of the batches `next_batch()` returns; the losses.

    The optimizer holds the parameters that require grad (a frozen vision tower stays out).
    `on_step(step, loss)`, when given, runs after each step (numbered from 1) and returns True to stop
    there (the VLM warm start's stop-at-accuracy check); the model is back in train mode for the next step."""
    from trainer.ops.logprobs import response_logprobs

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses: list[float] = []
    for step in range(1, steps + 1):
        model.train()
        batch = next_batch()
        logp, _ = response_logprobs(model, batch)  # [B, R]
        loss = -(logp * batch.response_mask).sum() / batch.response_mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if on_step is not None and on_step(step, losses[-1]):
            break
    model.eval()
    return losses


def build_cached(folder: Path, build: Callable[[Path], dict[str, Any]]) -> Path:
    """`folder`, built by `build(tmp_folder)` (which saves a model and returns its facts) unless already there."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(folder.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process builds; the others wait, then load
        if not (folder / "warm_start.json").is_file():
            tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            facts = build(tmp)
            (tmp / "warm_start.json").write_text(json.dumps(facts, indent=2))
            shutil.rmtree(folder, ignore_errors=True)
            tmp.rename(folder)
    return folder


def cache_folder(cfg: ModelConfig, seed: int) -> Path:
    """Where the warm start of `cfg` lives: the base's name and a hash of everything that shapes the result."""
    from trainer.models.specs import cache_dir

    ws = cfg.warm_start
    assert ws is not None
    random_base = cfg.path.startswith(("tiny:", "shape:")) or cfg.load_format == "dummy"
    key = {"path": cfg.path, "override_config": cfg.override_config, "load_format": cfg.load_format,
           "init_seed": seed if random_base else None, "warm_start": ws.model_dump()}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    base = cfg.path.split(":", 1)[1] if ":" in cfg.path and not cfg.path.startswith("/") else Path(cfg.path).name
    return cache_dir() / "models" / f"{base.replace('/', '_')}-sft-{ws.data}-{digest}"


@torch.no_grad()
def tool_first_prob(model: torch.nn.Module, tokenizer: Any, prompts: Sequence[list[int]]) -> float:
    """Mean probability (temperature 1) that the response to one of `prompts` opens with a tool call's first token.

    One forward over the right-padded prompts (causal attention: the padding after a prompt does not
    change its last position's logits). On 2 shared CPU cores (load 10-19), 32 prompts took 24 s this way and
    about 140 s one at a time."""
    from trainer.agent.tool_call import TOOL_CALL_OPEN

    if not prompts:
        return 0.0
    first = tokenizer.encode(TOOL_CALL_OPEN, add_special_tokens=False)[0]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([list(p) + [tokenizer.pad_token_id] * (width - len(p)) for p in prompts])  # [B, T]
    last = torch.tensor([len(p) - 1 for p in prompts])  # [B]
    logits = model(input_ids=ids).logits[torch.arange(len(prompts)), last].float()  # [B, V]
    return float(torch.softmax(logits, -1)[:, first].mean())


def train_tool_warm_start(model: torch.nn.Module, tokenizer: Any, ws: WarmStartConfig, out: Path) -> dict[str, Any]:
    """Warm-start `model` (in place, float32) on tool traces, save it to `out`; the facts for warm_start.json."""
    import random

    from trainer.data.synthetic import make_arithmetic_rows
    from trainer.data.tool_traces import tool_trace_examples

    t0 = time.perf_counter()
    _, traces = tool_trace_examples(tokenizer, num=ws.num_examples, difficulty=ws.difficulty,
                                    tool_fraction=ws.tool_fraction, seed=ws.seed,
                                    max_observation_tokens=ws.max_observation_tokens)
    rng = random.Random(ws.seed)
    order: list[int] = []

    def next_batch() -> Any:
        while len(order) < ws.batch_size:
            perm = list(range(len(traces)))
            rng.shuffle(perm)
            order.extend(perm)
        picked = [traces[order.pop(0)] for _ in range(ws.batch_size)]
        return sft_batch([t.prompt_ids for t in picked], [t.response_ids for t in picked], tokenizer.pad_token_id,
                         [t.response_mask for t in picked])

    torch.manual_seed(ws.seed)
    held_out = make_arithmetic_rows(32, difficulty=ws.difficulty, seed=ws.seed, split="val")
    from trainer.data.chat import tokenize_prompt

    held_prompts = [tokenize_prompt(tokenizer, r["prompt"]) for r in held_out]
    model.float()
    before = tool_first_prob(model, tokenizer, held_prompts)
    losses = supervised_steps(model, next_batch, ws.steps, ws.lr)
    after = tool_first_prob(model, tokenizer, held_prompts)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"setting": ws.model_dump(), "loss_first": losses[0], "loss_last": losses[-1],
            "tool_first_token_prob_before": before, "tool_first_token_prob_after": after,
            "num_held_out": len(held_prompts), "tool_traces": sum(t.uses_tool for t in traces),
            "num_traces": len(traces), "seconds": round(time.perf_counter() - t0, 1), "torch": torch.__version__}


def apply_warm_start(cfg: ModelConfig, model: torch.nn.Module, tokenizer: Any, *, seed: int) -> torch.nn.Module:
    """The warm-started version of the loaded `model` (built on first use, then read from the cache)."""
    from transformers import AutoModelForCausalLM

    from trainer.models.specs import resolve_dtype

    if cfg.path.startswith("tiny:qwen2.5-vl") or hasattr(model, "visual") or hasattr(getattr(model, "model", None), "visual"):
        raise ModelError(f"model.warm_start: {cfg.path} is a vision-language model (fix: drop model.warm_start; "
                         f"the figures' warm start is model.path tiny:qwen2.5-vl+sft-geometry-<level>-<steps>)")
    if cfg.upcycle_num_experts:
        raise ModelError("model.warm_start: not combined with model.upcycle_num_experts yet "
                         "(fix: drop one of them)")
    folder = cache_folder(cfg, seed)
    build_cached(folder, lambda out: train_tool_warm_start(model, tokenizer, cfg.warm_start, out))  # type: ignore[arg-type]
    return AutoModelForCausalLM.from_pretrained(folder, dtype=resolve_dtype(cfg.dtype),
                                                attn_implementation=cfg.attn_implementation)


def read_facts(cfg: ModelConfig, seed: int = 0) -> dict[str, Any] | None:
    """`warm_start.json` of `cfg`'s cached warm start, None when it is not built."""
    path = cache_folder(cfg, seed) / "warm_start.json"
    return json.loads(path.read_text()) if path.is_file() else None

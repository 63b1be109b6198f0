"""The upcycled SmolLM2-MoE on CPU: which experts kernel to train it with, and what it costs vs dense.

    python -m trainer.bench.moe_cpu                                  # defaults below, 1 thread
    python -m trainer.bench.moe_cpu --threads 2 --impls eager,grouped_mm --topk 1,2 --generate

For each variant (dense SmolLM2-135M-Instruct, then the upcycled Mixtral with `--experts` experts,
each `--topk` and each `--impls` entry of transformers' `experts_implementation`) one fp32 forward
+ backward of a `--batch` x `--seq` micro-batch (the cpu profiles' micro-batch: 8 sequences of a
~60-token prompt and up to 24 + 24 response tokens) is timed `--reps` times, best kept; with
`--generate`, a greedy HF `generate` of `--gen-batch` x `--gen-tokens` with the KV cache (the
rollout of the cpu profiles). Both wall seconds and process CPU seconds are printed, because on a
shared machine the wall time measures the neighbours too; the load average is printed with them.
`max|dlogp|` is the largest difference of the log-probs of the micro-batch's tokens from the dense
model's (step 0: upcycling keeps the function, trainer/models/moe.py).

`batched_mm` gathers one expert weight matrix per (token, expert) pair, `T k x 2I x H` floats
(8 x 110 tokens, top-2, SmolLM2: ~12 GB), so it is skipped unless named in `--impls`.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from trainer.config import ModelConfig
from trainer.models.loading import load_model_and_tokenizer

MODEL = "embedded:smollm2-135m-instruct"


def _timed(fn, reps: int) -> tuple[float, float, object]:
    """(best wall s, CPU s of that rep, last result) of `reps` calls."""
    best = (float("inf"), float("inf"))
    out = None
    for _ in range(reps):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        best = min(best, (time.perf_counter() - w, time.process_time() - c))
    return best[0], best[1], out


def forward_backward(model, ids: torch.Tensor, reps: int) -> tuple[float, float, torch.Tensor]:
    """Time forward + backward of the token log-probs' sum; returns (wall, cpu, log-probs)."""
    model.train()

    def step():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        logp.sum().backward()
        model.zero_grad(set_to_none=True)
        return logp.detach()

    return _timed(step, reps)


@torch.no_grad()
def generate(model, pad_id: int, batch: int, prompt: int, tokens: int) -> tuple[float, float]:
    model.eval()
    model.config.use_cache = True
    p = torch.randint(100, 40000, (batch, prompt), generator=torch.Generator().manual_seed(1))
    w, c, _ = _timed(lambda: model.generate(input_ids=p, attention_mask=torch.ones_like(p), max_new_tokens=tokens,
                                            min_new_tokens=tokens, do_sample=False, pad_token_id=pad_id), 1)
    model.config.use_cache = False
    return w, c


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--topk", default="2", help="comma-separated top-k values")
    ap.add_argument("--impls", default="eager,grouped_mm", help="comma-separated experts_implementation values")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=110)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--generate", action="store_true")
    ap.add_argument("--gen-batch", type=int, default=32)
    ap.add_argument("--gen-prompt", type=int, default=60)
    ap.add_argument("--gen-tokens", type=int, default=24)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    ids = torch.randint(100, 40000, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    variants = [("dense", {})] + [
        (f"E{args.experts} top-{k} {impl}", {"upcycle_num_experts": args.experts, "upcycle_top_k": int(k),
                                            "experts_implementation": impl})
        for k in args.topk.split(",") for impl in args.impls.split(",")]
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {args.threads} thread(s), "
          f"fwd+bwd {args.batch}x{args.seq} fp32" + (f", generate {args.gen_batch}x{args.gen_tokens}"
                                                      if args.generate else ""), flush=True)
    ref = None
    for name, kw in variants:
        model, tok = load_model_and_tokenizer(ModelConfig(path=MODEL, **kw), seed=0)
        wall, cpu, logp = forward_backward(model, ids, args.reps)
        ref = logp if ref is None else ref
        line = (f"{name:24s} fwd+bwd wall {wall:7.2f} s cpu {cpu:7.2f} s  max|dlogp| {float((logp - ref).abs().max()):.2e}")
        if args.generate:
            gw, gc = generate(model, tok.pad_token_id, args.gen_batch, args.gen_prompt, args.gen_tokens)
            line += f"  generate wall {gw:7.2f} s cpu {gc:7.2f} s"
        print(f"{line}  load {os.getloadavg()[0]:.1f}", flush=True)
        del model
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

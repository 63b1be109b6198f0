"""Tool calls overlapping decode in the agent loop: how much tool time the other samples' decoding hides.

    python3 tests/benchmarks/bench_agent_overlap.py                 # 8 samples, tiny random Qwen2, hf engine
    python3 tests/benchmarks/bench_agent_overlap.py --rows 16 --answer-tokens 64 --max-sleep 0.6

Each sample's first segment is a forced tool call (a random tiny model never writes one) whose
program sleeps `max_sleep * (i % 4) / 3` seconds, so the calls end at different times; the later
segments are real decoding by the `hf` engine on a random-init `tiny:qwen2` (up to
`--answer-tokens` tokens each), and the tool runs in the real sandbox. Prints the wall-clock of
the `generate` call, the time the engine spent decoding, the time the loop was blocked on tools
with nothing to decode (`timing_s/tool`), the tools' summed run time, and the share of tool run
time that ran while the engine decoded (`agent/tool_overlap_ratio`). Without overlap the wall
time would be at least the decode time plus the longest sleep; here it is about the decode time
plus the blocked time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from trainer.agent.loop import AgentRolloutEngine
from trainer.config import AgentConfig, ModelConfig
from trainer.models.loading import load_model_and_tokenizer
from trainer.models.specs import eos_token_ids
from trainer.rollout.base import InterruptibleEngine, SamplingParams
from trainer.rollout.hf import HFRolloutEngine


class CallFirst(InterruptibleEngine):
    """Segment 1 of row i: a tool call sleeping `sleeps[i]`; later segments: the real engine. Times its decodes."""

    def __init__(self, inner: HFRolloutEngine, tok, prompts: list[list[int]], sleeps: list[float]) -> None:
        self.inner, self.tok, self.version = inner, tok, 0
        self.calls = {tuple(p): tok.encode("<tool_call>" + json.dumps({"name": "execute_python_code", "arguments": {
            "code": f"import time; time.sleep({s:.3f}); print({i})"}}) + "</tool_call>", add_special_tokens=False)
            for i, (p, s) in enumerate(zip(prompts, sleeps))}
        self.decode_s = 0.0

    def decode_rows(self, rows, budgets, params, should_stop):
        t0 = time.perf_counter()
        first = [tuple(r) in self.calls for r in rows]
        out = self.inner.decode_rows([r for r, f in zip(rows, first) if not f], [b for b, f in zip(budgets, first)
                                     if not f], params, should_stop) if not all(first) else ([], [], [])
        toks, lps, fin = (iter(x) for x in out)
        res = [(self.calls[tuple(r)][:b], [-1.0] * len(self.calls[tuple(r)][:b]), "stop") if f else
               (next(toks), next(lps), next(fin)) for r, b, f in zip(rows, budgets, first)]
        self.decode_s += time.perf_counter() - t0
        return [r[0] for r in res], [r[1] for r in res], [r[2] for r in res]

    def update_weights(self, named_tensors) -> None:
        self.inner.update_weights(named_tensors)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--answer-tokens", type=int, default=48)
    ap.add_argument("--max-sleep", type=float, default=0.6)
    ap.add_argument("--parallel-tools", type=int, default=4)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model, tok = load_model_and_tokenizer(ModelConfig(path="tiny:qwen2", dtype="float32"), seed=0)
    eos = eos_token_ids(tok, model)
    prompts = [tok.encode(f"Question {i}: what is {i} + {i}?", add_special_tokens=False) for i in range(args.rows)]
    sleeps = [args.max_sleep * (i % 4) / 3 for i in range(args.rows)]
    inner = CallFirst(HFRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=eos), tok, prompts, sleeps)
    agent = AgentRolloutEngine(inner, tok, AgentConfig(enable=True, max_turns=2, max_parallel_tools=args.parallel_tools))
    budget = len(max(inner.calls.values(), key=len)) + 40 + args.answer_tokens
    agent.generate(prompts[:1], SamplingParams(max_new_tokens=budget))  # warm-up: the sandbox's zygote, the engine
    inner.decode_s = 0.0
    t0 = time.perf_counter()
    out = agent.generate(prompts, SamplingParams(max_new_tokens=budget, stop_token_ids=eos))
    wall = time.perf_counter() - t0
    st = out.turn_stats
    tool_s, blocked, hidden = (sum(s[k] for s in st) for k in ("tool_s", "tool_wall_s", "tool_overlap_s"))
    print(f"machine: {os.cpu_count()} CPUs, torch {torch.__version__}, load average {os.getloadavg()[0]:.2f}")
    print(f"{args.rows} samples, tool sleeps 0..{args.max_sleep:.2f} s, {args.parallel_tools} tools at once, "
          f"answers up to {args.answer_tokens} tokens (hf engine, tiny:qwen2)")
    print(f"tool calls: {sum(s['tool_calls'] for s in st)}, errors {sum(s['tool_errors'] for s in st)}")
    print(f"wall {wall:.3f} s = decode {inner.decode_s:.3f} s + blocked on tools {blocked:.3f} s "
          f"(+ {wall - inner.decode_s - blocked:.3f} s loop)")
    print(f"tool run time summed {tool_s:.3f} s, of it during decoding {hidden:.3f} s "
          f"(agent/tool_overlap_ratio {min(1.0, hidden / max(tool_s, 1e-9)):.2f})")
    print(f"a loop that waits for every tool before decoding again is blocked at least the longest sleep, "
          f"{max(sleeps):.3f} s; this one was blocked {blocked:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Run 5 record: the static engine eager vs `compile_decode` on a Qwen2.5-0.5B-shaped random bf16 model, batch 16,
512 greedy steps: ms per decode step and kernels in one (non-graph) decode step. Run on one H200 from the repo root:
`PYTHONPATH=. python3 tools/sm90/run5/decode_kernels.py` (its output was read from the console, not saved)."""
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from trainer.rollout.base import SamplingParams
from trainer.rollout.static import StaticRolloutEngine

cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True)
torch.manual_seed(0)
model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
prompts = [[(7 * i + j) % 1000 + 10 for j in range(40 + i)] for i in range(16)]
params = SamplingParams(greedy=True, max_new_tokens=512)
res = {}
for compiled in (False, True):
    eng = StaticRolloutEngine(model, pad_token_id=0, eos_token_ids=[151935], device="cuda", dtype=torch.bfloat16,
                              compile_decode=compiled, max_prompt_length=128, max_response_length=512)
    out = eng.generate(prompts, params)  # captures
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = eng.generate(prompts, params)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    steps = max(len(r) for r in out.response_ids)
    print(f"compile={compiled} compile_s={eng.compile_s:.1f} err={eng.compile_error} graph_err={eng.graph_error} "
          f"gen_s={dt:.3f} steps={steps} ms/step={1e3 * dt / steps:.3f}", flush=True)
    res[compiled] = out
    # kernels per eager (non-graph) decode step with the same functions
    slot = next(iter(eng._slots.values()))
    from torch.profiler import ProfilerActivity, profile
    slot.col.fill_(64); slot.t.fill_(1)  # back inside the buffers
    with torch.no_grad():
        eng._decode_step(slot, params); torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            eng._decode_step(slot, params); torch.cuda.synchronize()
        slot.col.fill_(64); slot.t.fill_(1)
    kern = [e for e in prof.events() if e.device_type.name == "CUDA"]
    print(f"compile={compiled} kernels/step={len(kern)} per layer~{len(kern) / 24:.1f}", flush=True)
same = sum(a == b for a, b in zip(res[False].response_ids, res[True].response_ids))
print("rows identical:", same, "/ 16; first-token agreement:",
      sum(a[:32] == b[:32] for a, b in zip(res[False].response_ids, res[True].response_ids)))

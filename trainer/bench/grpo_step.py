"""End-to-end GRPO step, this trainer against TRL's `GRPOTrainer`, same model, shapes and GPU.

Both sides: a random-init bf16 model of a public shape, 8 prompts x 8 samples, 128-token prompts,
exactly `new_tokens` sampled tokens per response (no row stops early: this trainer gets no stop
token, TRL gets `min_new_tokens`), a reward function that costs nothing, no KL term, one
optimizer step per generation. Timed per step with the device synchronized; the first steps are
warm-up (graph capture here, CUDA/cuBLAS warm-up in both).

This trainer's step is the colocated loop's body: static-engine rollout (bf16 copy of the
weights) -> padded batch -> GRPO advantages -> actor update (fp32 master weights, bf16 autocast)
-> in-place weight sync into the engine. Step 0 also measures the rollout/trainer mismatch:
`training/rollout_probs_diff_*` (trainer's log-probs vs the engine's) and `actor/ppo_kl` with the
engine's log-probs as the old policy (`rollout.log_prob_source: rollout`).

Mixture-of-experts shapes (`shape:qwen3-30b-a3b-l4`: Qwen3-30B-A3B's width, 4 layers) run the same
step on both sides; the static engine decodes the MoE layers through its fused Triton block on CUDA
(trainer/ops/moe_decode.py; mode `+hf_moe`: transformers' MoE block, as before) and prefills them
through transformers' block (trainer/rollout/static.py). On CPU (tests/unit/test_bench_grpo_moe.py) the same functions run
without a device sync, and peak memory reads NaN.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

import torch

from trainer.algorithms.advantages import compute_advantages
from trainer.algorithms.mismatch import rollout_mismatch_metrics
from trainer.backends.actor import Actor
from trainer.bench.perf import random_prompts, shape_model, sync
from trainer.components.batch import batch_from_rollout
from trainer.config import ActorConfig
from trainer.ops.flops import matmul_params
from trainer.rollout.base import SamplingParams


def ours(shape: str, *, num_prompts: int, n: int, prompt_len: int, new_tokens: int, device: torch.device,
         steps: int = 5, warmup: int = 1, micro: int = 32, mixed_precision: str = "bf16", chunk: int = 1024,
         compile_actor: bool = False, compile_decode: bool = False, moe_decode: str | None = None
         ) -> dict[str, Any]:
    """This trainer's step; `mixed_precision` / `chunk` / `compile_actor` are the actor's
    `mixed_precision` / `logprob_chunk_size` / `compile` (fp32 master weights in every mode),
    `compile_decode` and `moe_decode` the static engine's options of those names (None: its default)."""
    from trainer.rollout.static import StaticRolloutEngine

    model = shape_model(shape, "float32", device)
    acfg = ActorConfig(lr=1e-6, ppo_mini_batch_size=num_prompts, ppo_micro_batch_size_per_gpu=micro,
                       mixed_precision=mixed_precision, logprob_chunk_size=chunk, compile=compile_actor)
    actor = Actor(model, acfg, temperature=1.0, max_response_length=new_tokens, device=device)
    engine = StaticRolloutEngine(model, pad_token_id=0, eos_token_ids=[], dtype=torch.bfloat16, device=device,
                                 prompt_bucket=prompt_len, compile_decode=compile_decode,
                                 **({} if moe_decode is None else {"moe_decode": moe_decode}))
    params = SamplingParams(n=n, temperature=1.0, max_new_tokens=new_tokens)
    rng = random.Random(0)
    times: list[float] = []
    warmup_s: list[float] = []
    parts: list[dict[str, float]] = []
    mismatch: dict[str, float] = {}
    for step in range(warmup + steps):
        prompts = random_prompts(num_prompts, prompt_len, model.config.vocab_size, seed=step)
        sync()
        t0 = time.perf_counter()
        roll = engine.generate(prompts, params)
        sync()
        t_gen = time.perf_counter()
        batch = batch_from_rollout(roll, pad_token_id=0, max_response_length=new_tokens)
        batch.scores = torch.tensor([rng.random() for _ in range(len(batch))])
        batch.advantages, _ = compute_advantages("grpo", batch.response_mask, scores=batch.scores,
                                                 group_index=batch.group_index)
        if step == 0:  # mismatch at step 0: trainer log-probs vs the engine's, and ppo_kl with old = engine's
            trainer_lp = actor.compute_logprobs(batch)
            mismatch = rollout_mismatch_metrics(trainer_lp, batch.rollout_logprobs, batch.response_mask)
            batch.old_logprobs = batch.rollout_logprobs.clone()
            m = actor.update(batch, n)
            mismatch["actor/ppo_kl"] = m["actor/ppo_kl"]
            mismatch["actor/pg_clipfrac"] = m["actor/pg_clipfrac"]
        else:
            m = actor.update(batch, n, reuse_forward_as_old=True)
        sync()
        t_upd = time.perf_counter()
        engine.update_weights(actor.named_weights())
        sync()
        t_end = time.perf_counter()
        if step < warmup:
            warmup_s.append(t_end - t0)  # graph capture / compilation included
        else:
            times.append(t_end - t0)
            parts.append({"gen_s": t_gen - t0, "update_s": t_upd - t_gen, "sync_s": t_end - t_upd,
                          "mfu_actor": m.get("perf/mfu/actor", float("nan")),
                          "completion_tokens": sum(map(len, roll.response_ids))})
    med = statistics.median(times)
    completion = num_prompts * n * new_tokens
    out = {"side": "rlbench", "mode": mode_tag(mixed_precision, compile_actor, compile_decode, moe_decode == "module"),
           "moe_decode": engine.moe_decode, "chunk": chunk,
           "median_step_s": med, "completion_tok_s": completion / med, "times_s": times,
           **{k: statistics.median(p[k] for p in parts) for k in ("gen_s", "update_s", "sync_s", "mfu_actor")},
           "warmup_s": warmup_s, "parts": parts, "graph_capture_s": engine.compile_s, "graph_error": engine.graph_error,
           "compile_error": engine.compile_error, "step0_mismatch": mismatch,
           "experts_implementation": getattr(model.config, "_experts_implementation", None),
           "params": sum(p.numel() for p in model.parameters()), "active_matmul_params": matmul_params(model.config),
           "peak_mem_gib": peak_mem_gib(device)}
    del actor, engine, model
    torch.cuda.empty_cache()  # a no-op without CUDA
    return out


def peak_mem_gib(device: torch.device) -> float:
    """Peak allocated device memory (GiB) of this process; NaN off CUDA."""
    return torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else float("nan")


def mode_tag(mixed_precision: str, compile_actor: bool, compile_decode: bool, hf_moe: bool = False) -> str:
    """`bf16_params+compile+compile_decode`-style name of one variant of this trainer's step (`+hf_moe`: the
    engine's moe_decode=module, transformers' MoE block in the decode step)."""
    return "+".join([mixed_precision] + ["compile"] * compile_actor + ["compile_decode"] * compile_decode
                    + ["hf_moe"] * hf_moe)


def _wide_tokenizer(vocab: int) -> Any:
    """A word-level tokenizer covering the model's whole vocabulary (`t0 .. t{V-1}`), built on the spot."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token=f"t{vocab - 1}", unk_token="t0")


def trl(shape: str, *, num_prompts: int, n: int, prompt_len: int, new_tokens: int, device: torch.device,
        steps: int = 5, warmup: int = 1) -> dict[str, Any]:
    import trl as trl_pkg
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model = shape_model(shape, "bfloat16", device)
    vocab = model.config.vocab_size
    tokenizer = _wide_tokenizer(vocab)
    prompts = random_prompts(num_prompts * (warmup + steps), prompt_len, vocab, seed=123)
    data = Dataset.from_list([{"prompt": " ".join(f"t{i}" for i in p)} for p in prompts])
    times: list[float] = []
    lengths: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            sync()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            sync()
            times.append(time.perf_counter() - self.t0)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    cfg = GRPOConfig(output_dir="/tmp/trl_out", per_device_train_batch_size=num_prompts * n,
                     gradient_accumulation_steps=1, num_generations=n, max_completion_length=new_tokens,
                     generation_kwargs={"min_new_tokens": new_tokens}, temperature=1.0, learning_rate=1e-6,
                     bf16=True, max_steps=warmup + steps, logging_steps=1, report_to="none", save_strategy="no",
                     use_vllm=False, seed=0, shuffle_dataset=False, use_cpu=device.type == "cpu")
    rng = random.Random(0)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [rng.random() for _ in completions],
                          args=cfg, train_dataset=data, processing_class=tokenizer, callbacks=[Timer()])
    trainer.train()
    measured = times[warmup:]
    med = statistics.median(measured)
    completion = num_prompts * n * new_tokens
    out = {"side": "trl", "trl_version": trl_pkg.__version__, "median_step_s": med, "completion_tok_s": completion / med,
           "times_s": times, "mean_completion_length": lengths, "peak_mem_gib": peak_mem_gib(device)}
    del trainer, model
    torch.cuda.empty_cache()  # a no-op without CUDA
    return out

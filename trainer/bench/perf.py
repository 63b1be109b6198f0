"""GPU performance benchmarks: ceilings, rollout, training, weight sync, end-to-end GRPO step.

Every function returns plain dicts (one row per configuration) that `trainer.bench.__main__`
prints as a table and writes to JSON with the machine, versions and commit.

Rooflines (METHOD: bytes and FLOPs first, measured ceilings second):
- decode: each step reads every weight once plus each row's KV cache so far. For `S` new tokens
  after a `P`-token prompt at batch `B`, bytes = S * W + B * kv * sum_{t<S}(P + t), where W is the
  weight bytes and kv the K+V bytes per token over all layers. The floor is bytes / copy bandwidth
  (a device-to-device copy, read + write counted), and roofline tok/s = B * S / floor.
- training: model FLOPs (`trainer.ops.flops.train_flops`) over the measured bf16 matmul rate
  (8192^3 product on random data) and over the vendor's dense bf16 figure.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from trainer.backends.actor import Actor
from trainer.components.batch import batch_from_rollout
from trainer.config import ActorConfig, ModelConfig
from trainer.models.loading import load_model_and_tokenizer
from trainer.ops.flops import matmul_params, mfu, train_flops
from trainer.rollout.base import Rollout, SamplingParams


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> tuple[list[float], Any]:
    """Wall seconds of `repeats` calls after `warmup` calls (device synchronized around each)."""
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return times, out


# ----------------------------------------------------------------------------- ceilings
def ceilings(device: torch.device) -> dict[str, float]:
    """Measured copy bandwidth (GB/s, read + write) and bf16 matmul rate (TFLOP/s), medians."""
    n = 1 << 30  # 1 GiB per buffer
    src = torch.randn(n // 4, device=device)
    dst = torch.empty_like(src)
    bw_times, _ = timed(lambda: dst.copy_(src), repeats=20, warmup=3)
    m = 8192
    a = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    mm_times, _ = timed(lambda: a @ b, repeats=20, warmup=3)
    del src, dst, a, b
    return {"copy_gbps": 2 * n / statistics.median(bw_times) / 1e9,
            "bf16_matmul_tflops": 2 * m ** 3 / statistics.median(mm_times) / 1e12}


# ----------------------------------------------------------------------------- models
def shape_model(shape: str, dtype: str, device: torch.device, seed: int = 0) -> torch.nn.Module:
    """Random-init model of a public shape (`shape:qwen2.5-0.5b`), on `device`."""
    model, _ = load_model_and_tokenizer(ModelConfig(path=f"shape:{shape}", dtype=dtype, load_format="dummy"), seed=seed)
    return model.to(device)


def random_prompts(num: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1000, vocab - 1000, (num, length), generator=g).tolist()


def decode_roofline(config: Any, batch: int, prompt_len: int, new_tokens: int, bytes_per_param: int,
                    copy_gbps: float) -> float:
    """Tokens/s at which decode would be purely weight + KV bandwidth bound (module docstring)."""
    heads = config.num_attention_heads
    d = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv = 2 * config.num_hidden_layers * config.num_key_value_heads * d * bytes_per_param
    weights = _total_params(config) * bytes_per_param
    total = new_tokens * weights + batch * kv * sum(prompt_len + t for t in range(new_tokens))
    return batch * new_tokens / (total / (copy_gbps * 1e9))


def _total_params(config: Any) -> int:
    tied = getattr(config, "tie_word_embeddings", False)
    return matmul_params(config) + (0 if tied else config.vocab_size * config.hidden_size)


# ----------------------------------------------------------------------------- rollout
def bench_rollout(shape: str, batches: list[int], *, prompt_len: int, new_tokens: int, copy_gbps: float,
                  device: torch.device, repeats: int = 3, engines: tuple[str, ...] = ("static", "hf_generate"),
                  decode_modes: tuple[str, ...] = ("eager", "compiled")) -> list[dict[str, Any]]:
    """Sampled decode tok/s per engine and batch size, every row running to `new_tokens`.

    `decode_modes`: the static engine without (`eager`) and with (`compiled`) its `compile_decode`
    option, side by side in one process; compilation and graph capture are reported apart.
    """
    from trainer.rollout.static import StaticRolloutEngine

    model = shape_model(shape, "bfloat16", device)
    cfg = model.config
    rows: list[dict[str, Any]] = []
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=new_tokens)
    static = [mode for mode in decode_modes if "static" in engines]
    for b in batches:
        prompts = random_prompts(b, prompt_len, cfg.vocab_size, seed=b)
        roof = decode_roofline(cfg, b, prompt_len, new_tokens, 2, copy_gbps)
        for mode in static:
            engine = StaticRolloutEngine(model, pad_token_id=0, eos_token_ids=[], share_weights=True,
                                         prompt_bucket=prompt_len, compile_decode=mode == "compiled")
            sync()
            t0 = time.perf_counter()
            first = engine.generate(prompts, params)
            sync()
            first_s = time.perf_counter() - t0
            times, out = timed(lambda: engine.generate(prompts, params), repeats=repeats, warmup=0)
            assert all(len(r) == new_tokens for r in out.response_ids), "a row stopped early"
            med = statistics.median(times)
            rows.append({"engine": "static", "decode": mode, "shape": shape, "batch": b, "prompt_len": prompt_len,
                         "new_tokens": new_tokens, "median_s": med, "tok_s": b * new_tokens / med,
                         "roofline_tok_s": roof, "frac_roofline": b * new_tokens / med / roof,
                         "graph_capture_s": engine.compile_s, "first_call_s": first_s, "times_s": times,
                         "cuda_graphs": engine.use_graphs, "graph_error": engine.graph_error,
                         "compile_decode": engine.compile_decode, "compile_error": engine.compile_error})
            del first, engine
            torch.cuda.empty_cache()
        if "hf_generate" in engines:
            ids = torch.tensor(prompts, device=device)
            gen = lambda: model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                         temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                                         min_new_tokens=new_tokens, pad_token_id=0)
            times, _ = timed(gen, repeats=1, warmup=1)
            med = statistics.median(times)
            rows.append({"engine": "hf_generate", "shape": shape, "batch": b, "prompt_len": prompt_len,
                         "new_tokens": new_tokens, "median_s": med, "tok_s": b * new_tokens / med,
                         "roofline_tok_s": roof, "frac_roofline": b * new_tokens / med / roof, "times_s": times})
    return rows


# ----------------------------------------------------------------------------- training
def synthetic_rollout(num: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0) -> Rollout:
    """`num` full-length responses of random tokens, each its own group of one."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1000, vocab - 1000, (num, prompt_len), generator=g).tolist()
    resp = torch.randint(1000, vocab - 1000, (num, response_len), generator=g).tolist()
    lps = (-torch.rand(num, response_len, generator=g) * 5).tolist()
    return Rollout(prompt_ids=prompts, response_ids=resp, response_logprobs=lps, finish_reasons=["length"] * num,
                   group_index=list(range(num)))


def bench_training(shape: str, *, num_seqs: int, seq_len: int, prompt_len: int, micro: int, device: torch.device,
                   matmul_tflops: float, vendor_tflops: float, steps: int = 3, mixed_precision: str = "bf16",
                   gradient_checkpointing: bool = False, chunk: int = 1024, profile: bool = False,
                   compile_layers: bool = False) -> dict[str, Any]:
    """One actor update (fwd + bwd + AdamW) over `num_seqs x seq_len` tokens: tok/s, MFU, peak memory.

    `mixed_precision`: `bf16` (fp32 params under autocast), `bf16_params` (bf16 params, fp32 masters)
    or `none` (a bf16 model throughout, no fp32 master). `compile_layers`: `actor.compile: true`
    (compiled decoder layers and LM-head chunks, fixed shapes); the first (warm-up) step's extra
    time over the median is reported as `compile_s`, with dynamo's graph / graph-break counts.
    Repeatability: every timed step's wall time (`times_s`, min/median/max), the Python GC pause
    time inside each step (`gc_ms`), and, with `profile`, the summed kernel time of one step
    (`profile_kernel_total_ms`; wall minus that is host-side gaps).
    """
    import gc

    from torch._dynamo.utils import counters

    torch.cuda.reset_peak_memory_stats(device)
    master = "float32" if mixed_precision in ("bf16", "bf16_params") else "bfloat16"
    model = shape_model(shape, master, device)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    counters.clear()
    acfg = ActorConfig(lr=1e-6, ppo_mini_batch_size=num_seqs, ppo_micro_batch_size_per_gpu=micro,
                       mixed_precision=mixed_precision, logprob_chunk_size=chunk, compile=compile_layers)
    actor = Actor(model, acfg, temperature=1.0, max_response_length=seq_len - prompt_len, device=device)
    roll = synthetic_rollout(num_seqs, prompt_len, seq_len - prompt_len, model.config.vocab_size)
    batch = batch_from_rollout(roll, pad_token_id=0)
    batch.advantages = torch.randn(batch.response_mask.shape)
    metrics: list[dict[str, float]] = []

    gc_ms: list[float] = []
    gc_t0: list[float] = []

    def gc_timer(phase: str, info: dict) -> None:
        if phase == "start":
            gc_t0.append(time.perf_counter())
        elif gc_t0:
            gc_ms[-1] += (time.perf_counter() - gc_t0.pop()) * 1e3

    def step() -> None:
        gc_ms.append(0.0)
        metrics.append(actor.update(batch, 1, reuse_forward_as_old=True))
        batch.old_logprobs = None

    sync()
    t0 = time.perf_counter()
    step()  # warm-up (and compilation)
    sync()
    first_s = time.perf_counter() - t0
    graphs_after_warmup = counters["stats"].get("unique_graphs", 0)
    gc.callbacks.append(gc_timer)
    try:
        times, _ = timed(step, repeats=steps, warmup=0)
    finally:
        gc.callbacks.remove(gc_timer)
    med = statistics.median(times)
    tokens = num_seqs * seq_len
    flops = train_flops(model.config, [seq_len] * num_seqs)
    flops_6n = 6.0 * matmul_params(model.config) * tokens
    out = {"shape": shape, "num_seqs": num_seqs, "seq_len": seq_len, "micro_batch": micro,
           "mixed_precision": mixed_precision, "master_dtype": master,
           "param_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
           "gradient_checkpointing": gradient_checkpointing, "compile_layers": compile_layers,
           "median_s": med, "tok_s": tokens / med, "times_s": times, "first_step_s": first_s,
           "min_s": min(times), "max_s": max(times), "tok_s_min": tokens / max(times), "tok_s_max": tokens / min(times),
           "gc_ms": gc_ms[1:], "compile_s": first_s - med if compile_layers else None,
           "dynamo_graphs_after_warmup": graphs_after_warmup,
           "dynamo_graphs_end": counters["stats"].get("unique_graphs", 0),
           "dynamo_graph_breaks": sum(counters["graph_break"].values()),
           "mfu_vs_measured_6n": mfu(flops_6n, med, matmul_tflops), "mfu_vs_measured": mfu(flops, med, matmul_tflops),
           "mfu_vs_vendor": mfu(flops, med, vendor_tflops),
           "actor_metric_mfu": metrics[-1].get("perf/mfu/actor"),
           "last_grad_norm": metrics[-1].get("actor/grad_norm"), "last_pg_loss": metrics[-1].get("actor/pg_loss"),
           "weights_finite": all(bool(torch.isfinite(p).all()) for p in model.parameters()),
           "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2 ** 30,
           "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / 2 ** 30}
    out["logprob_chunk_size"] = chunk
    if profile:
        t0 = time.perf_counter()
        out["profile_top_kernels"], out["profile_kernel_total_ms"] = profile_top(step, top=40, with_total=True)
        out["profile_step_wall_s"] = time.perf_counter() - t0  # profiler overhead included
    del actor, model
    torch.cuda.empty_cache()
    return out


def profile_top(fn: Callable[[], Any], top: int = 20, with_total: bool = False) -> Any:
    """Device time per kernel name over one call of `fn`, largest first (and the sum over all
    kernels in ms when `with_total`)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        sync()
    rows = []
    for e in prof.key_averages():
        dev_us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
        rows.append({"name": e.key[:90], "device_ms": dev_us / 1e3, "count": e.count})
    rows.sort(key=lambda r: -r["device_ms"])
    if with_total:
        kernels = [e for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
        return rows[:top], sum(e.time_range.elapsed_us() for e in kernels) / 1e3
    return rows[:top]


# ----------------------------------------------------------------------------- weight sync
def bench_weight_sync(shape: str, device: torch.device, repeats: int = 10, mixed_precision: str = "bf16"
                      ) -> dict[str, Any]:
    """Colocated sync into the bf16 rollout engine, in place: fp32 weights cast on the way (`bf16`), or
    the trainer's bf16 module weights copied as they are (`bf16_params`; the fp32 masters stay behind)."""
    from trainer.rollout.static import StaticRolloutEngine

    model = shape_model(shape, "float32", device)
    actor = Actor(model, ActorConfig(mixed_precision=mixed_precision), temperature=1.0, max_response_length=8,
                  device=device)
    engine = StaticRolloutEngine(model, pad_token_id=0, eos_token_ids=[], dtype=torch.bfloat16, device=device)
    if actor.master is not None:  # make the masters differ from the engine's initial copy
        with torch.no_grad():
            torch._foreach_mul_(actor.master.masters, 1.5)
        actor.master.sync_to_model()
    times, _ = timed(lambda: engine.update_weights(actor.named_weights()), repeats=repeats, warmup=2)
    ok = all(torch.equal(p.to(torch.bfloat16), engine._params[n]) for n, p in model.named_parameters())
    out = {"shape": shape, "mixed_precision": mixed_precision, "median_ms": statistics.median(times) * 1e3,
           "times_ms": [t * 1e3 for t in times], "weights_match": ok,
           "params": sum(p.numel() for p in model.parameters())}
    del actor, model, engine
    torch.cuda.empty_cache()
    return out

"""MoE training on one GPU: the Megatron backend against FSDP2 + transformers, and a CPU-parity check.

    python -m trainer.bench.moe_backends --reference ref.pt          # CPU: write the fp32 reference
    python -m trainer.bench.moe_backends --check ref.pt --bench      # GPU: parity check, then the benchmark

`--reference`: a tiny Qwen3-MoE (4 experts, top-2), its initial weights, one batch, and the HF-named
weights after `MegatronActor.update` (two mini-batches) on CPU in fp32 (torch AdamW).
`--check`: the same update on CUDA, in fp32 (held to the CPU tests' bound) and with bf16 parameters
(a bf16 bound), megatron's DDP + distributed optimizer (fp32 masters) and the loops' token dispatcher;
prints how far the weights are from the CPU run.
`--bench`: a Qwen3-30B-A3B-shaped model (hidden 2048, 128 experts of 768, top-8, 32/4 heads of 128,
vocab 151936; `--layers` of its 48) with random weights, `--accum` micro-batches of `--batch` x `--seq`
tokens per optimizer step, gradients clipped to norm 1 as the actor does. Variants (`--variants`):
transformers' Qwen3MoeForCausalLM (`experts_implementation` = grouped_mm, bf16 params and Adam state,
fused AdamW) and megatron-core's GPTModel through mbridge (local spec, bf16 params, megatron DDP with
fp32 grad buffers + distributed optimizer with fp32 masters, alltoall dispatcher, `GroupedExperts`
and `CausalSDPA`, torch's fused Adam), and that with one setting changed each: foreach Adam,
allgather dispatcher, megatron's unfused attention, megatron's `moe_grouped_gemm=True` (which without
TransformerEngine builds SequentialMLP: experts one at a time). Prints tok/s, MFU on active
parameters (6 x active matmul parameters x tokens + causal attention, over `--peak-tflops`), peak
memory; `--profile` adds the top CUDA kernels of one step.
Those variants train on a language-model loss over every token with the bare models. The actor
variants, `fsdp2 actor` and `megatron actor`, time what the training loops run instead: one
`Actor.update` (policy loss, log-probs and entropy through the chunked LM head on the response tokens,
clipping) on rows of `ACTOR_PROMPT` prompt tokens plus a response, both with fp32 master weights:
transformers' model under `actor.mixed_precision: bf16_params`, and `MegatronActor` with megatron's DDP
and distributed optimizer, its MoE layers dispatched as the loops do (`actor.megatron.token_dispatcher`
auto: the local dispatcher at EP 1; `megatron actor alltoall`: megatron's alltoall dispatcher); the
`... keep logits` variants set `actor.lm_head_keep_logits` (no LM-head recompute in the backward). Their MFU
counts the LM head on response tokens only. Run each variant in a process of its own when memory is tight
(`--variants "megatron actor"`).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import traceback

import torch

from trainer.config import ActorConfig

ARGS_LR = 1e-3  # the Adam check's lr
SGD_LR = 0.04  # the SGD check's lr: updates ~4e-4 rms per element, far above the fp32 rounding of the weights
BROKEN_LR_SCALE = 1.03  # the deliberately broken SGD run: the GPU step 3% too large (the check must fail it)
ACTOR_PROMPT = 128  # actor variants: prompt tokens of each row (the rest is its response)
# SGD check bound r, norm-wise per tensor on the update and the gradients (see check()): bf16 params with
# fp32 masters 4 units of bf16 roundoff (4 x 2^-8); fp32 the CPU tests' rtol. Element-wise 4 r (|x| + rms)
# for at least 99.9% of the elements (a normal error of spread r exceeds 3.3 r in 0.1% of them)
SGD_RTOL = {torch.bfloat16: 4 * 2.0**-8, torch.float32: 1e-4}
ELEMENT_FACTOR = 4.0
FP32_WEIGHT_ROUNDING = 4 * 2.0**-24  # two steps, each rounding the fp32 weight on each side: |w| x this


def _tiny_moe():
    from trainer.config import ModelConfig
    from trainer.models.loading import load_model_and_tokenizer

    m, _ = load_model_and_tokenizer(ModelConfig(path="tiny:qwen3_moe"), seed=0)
    with torch.no_grad():
        for r in m.modules():
            if type(r).__name__.endswith("TopKRouter"):
                r.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
    return m


# update rules of the parity check: name -> (lr, Adam betas, Adam eps); `sgd` is plain SGD. `adam_linear` is
# Adam with beta1 = 0 and eps = 1000: its step lr g / (sqrt(v_hat) + 1000) is lr g / 1000 to within |g| / 1000
# (< 1e-3 here), so proportional to the gradient like SGD's (lr 1000x SGD's for the same step), and it runs in
# megatron's distributed optimizer, which refuses SGD
LINEAR_EPS = 1000.0
RULES = {"adam": (ARGS_LR, (0.9, 0.999), 1e-8), "sgd": (SGD_LR, None, None),
         "adam_linear": (SGD_LR * LINEAR_EPS, (0.0, 0.999), LINEAR_EPS)}


def _actor_cfg(optimizer: str = "adam") -> ActorConfig:
    # megatron.optimizer=torch: the check sets megatron's optimizer itself, with the update rule under test
    lr, betas, _ = RULES[optimizer]
    return ActorConfig(lr=lr, betas=betas or (0.9, 0.999), ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2,
                       grad_clip=1e9, megatron={"optimizer": "torch"})


def _batch():
    from tests.helpers.batches import N_RESP, R, unequal_lengths_batch

    b, g = unequal_lengths_batch(5)
    b.advantages = torch.randn(N_RESP, 1, generator=g).expand(N_RESP, R) * b.response_mask
    b.old_logprobs = -2.0 + 0.1 * torch.randn(N_RESP, R, generator=g)
    return b


def _megatron_named(a) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().cpu().clone() for k, v in a.gpt.named_parameters()}


def _fp32_masters(params: list[torch.nn.Parameter], make) -> torch.optim.Optimizer:
    """`make(masters)`'s optimizer over fp32 copies of bf16 `params`, as megatron's mixed-precision optimizer on the
    GPU: before each step the bf16 gradient goes to its master as fp32 (and leaves the param), after it the
    master is rounded back into the param."""
    masters = [torch.nn.Parameter(p.detach().float().clone()) for p in params]
    opt = make(masters)

    def pre(*_):
        for p, m in zip(params, masters):
            m.grad = p.grad.float()
            p.grad = None

    def post(*_):
        with torch.no_grad():
            for p, m in zip(params, masters):
                p.copy_(m)

    opt.register_step_pre_hook(pre)
    opt.register_step_post_hook(post)
    opt.masters = dict(zip(map(id, params), masters))
    return opt


def reference(path: str, optimizer: str = "adam", dtype: torch.dtype = torch.float32, base: str | None = None) -> None:
    """CPU: the update with torch AdamW (`adam`, `adam_linear`) or plain SGD (`sgd`), the gradients of each
    mini-batch (after the reduction, before the step) and the weights by HF and by megatron name. fp32, or
    `dtype` bfloat16: bf16 params with fp32 masters (`_fp32_masters`), the GPU bf16 run's arithmetic on the CPU;
    then `base` (the fp32 reference of the same rule) gives the old log-probs, so both see the same batch."""
    from trainer.backends.megatron.backend import MegatronActor

    hf = _tiny_moe()
    init = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    a = MegatronActor.from_hf(hf, _actor_cfg(optimizer), temperature=1.0, max_response_length=6,
                              device=torch.device("cpu"), dtype=dtype)
    params = [p for p in a.model.parameters() if p.requires_grad]
    lr, betas, eps = RULES[optimizer]
    if optimizer == "sgd":
        def make(ps): return torch.optim.SGD(ps, lr=lr, momentum=0.0)
    else:
        def make(ps): return torch.optim.AdamW(ps, lr=lr, betas=betas, eps=eps, weight_decay=0.0)
    a.optimizer = make(params) if dtype == torch.float32 else _fp32_masters(params, make)
    a.scheduler = torch.optim.lr_scheduler.LambdaLR(a.optimizer, lambda s: 1.0)
    init_mg = _megatron_named(a)
    batch = _batch()
    if base is not None:
        b = torch.load(base, weights_only=False)
        if b.get("optimizer", "adam") != optimizer or b.get("dtype", "float32") != "float32":
            raise SystemExit(f"--base {base}: not an fp32 reference of rule {optimizer} (fix: pass the one "
                             f"written with --optimizer {optimizer} and no --dtype)")
        batch.old_logprobs = b["old_logprobs"]
    else:
        # old log-probs near the initial policy's (ratio ~ exp(+-0.05)), so the clip leaves every mini-batch a
        # gradient (the fixed -2 +- 0.1 of `_batch`, far from this model's ~-5.5, clips the second one entirely)
        logp0 = a.compute_logprobs(batch)
        batch.old_logprobs = logp0 + 0.05 * torch.randn(logp0.shape, generator=torch.Generator().manual_seed(7))
    grads: list[dict[str, torch.Tensor]] = []
    finish = a.finish_grads_and_clip

    def recording() -> torch.Tensor:
        norm = finish()  # grad_clip 1e9: no clipping, the grads are the reduced ones
        grads.append({k: p.grad.detach().float().clone() for k, p in a.gpt.named_parameters()})
        return norm

    a.finish_grads_and_clip = recording
    metrics = a.update(batch, 2)
    masters = getattr(a.optimizer, "masters", None)  # bf16: the update is the fp32 masters'
    after_mg = ({k: masters[id(p)].detach().clone() for k, p in a.gpt.named_parameters()} if masters is not None
                else _megatron_named(a))
    torch.save({"optimizer": optimizer, "dtype": str(dtype).removeprefix("torch."), "lr": a.cfg.lr,
                "old_logprobs": batch.old_logprobs, "init": init,
                "after": {k: v.float() for k, v in a.named_weights()},
                "init_megatron": init_mg, "after_megatron": after_mg, "grads": grads,
                "metrics": metrics}, path)
    print(f"reference written: {path} optimizer={optimizer} dtype={dtype} grad_norm={metrics['actor/grad_norm']:.6f}")


def _masters(a) -> dict[str, torch.Tensor]:
    """The fp32 master weights of megatron's distributed optimizer by megatron name (one data-parallel rank:
    each shard is its whole parameter)."""
    names = {id(p): k for k, p in a.gpt.named_parameters()}
    out = {}
    for opt in getattr(a.megatron_optimizer, "chained_optimizers", [a.megatron_optimizer]):
        # the distributed optimizer's shards, or the non-distributed mixed-precision optimizer's copies
        pairs = list(zip(getattr(opt, "model_float16_groups", []), getattr(opt, "shard_fp32_from_float16_groups", [])))
        pairs += list(zip(getattr(opt, "model_fp32_groups", []), getattr(opt, "shard_fp32_groups", [])))
        pairs += list(zip(getattr(opt, "float16_groups", []), getattr(opt, "fp32_from_float16_groups", [])))
        for model_group, main_group in pairs:
            for p, main in zip(model_group, main_group):
                if main.numel() != p.numel():
                    raise RuntimeError("_masters: a shard is not its whole parameter (more than one DP rank)")
                out[names[id(p)]] = main.detach().float().cpu().view(p.shape).clone()
    return out


def _rel_check(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], rtol: float,
               weights: dict[str, torch.Tensor] | None = None) -> dict:
    """Elements with |got - want| > ELEMENT_FACTOR x rtol (|want| + rms(want of the tensor)) + a, and tensors with
    ||got - want|| > rtol ||want|| + ||a||, where a = FP32_WEIGHT_ROUNDING x |weight| when `want` is an update of
    `weights` (0 for gradients). Pass: at most 0.1% of the elements and no tensor outside."""
    out_n, n, worst_rel, worst_name, max_abs, bad_tensors = 0, 0, 0.0, "", 0.0, []
    for k, w in want.items():
        d = (got[k] - w).abs()
        a = FP32_WEIGHT_ROUNDING * weights[k].abs() if weights is not None else torch.zeros_like(w)
        rms = float(w.pow(2).mean().sqrt())
        out_n += int((d > ELEMENT_FACTOR * rtol * (w.abs() + rms) + a).sum())
        n += w.numel()
        rel = float(d.norm() / w.norm().clamp_min(1e-30))
        if float(d.norm()) > rtol * float(w.norm()) + float(a.norm()):
            bad_tensors.append(k)
        if rel > worst_rel:
            worst_rel, worst_name = rel, k
        max_abs = max(max_abs, float(d.max()))
    return {"elements_outside": out_n, "elements": n, "worst_tensor_rel_err": worst_rel, "worst_tensor": worst_name,
            "tensors_outside": bad_tensors, "max_abs_diff": max_abs, "rtol": rtol, "element_factor": ELEMENT_FACTOR,
            "pass": out_n <= n // 1000 and not bad_tensors}


def check(path: str, dtype: torch.dtype = torch.bfloat16, lr_scale: float = 1.0) -> dict:
    """The reference's update on CUDA with `dtype` parameters, megatron's DDP + distributed optimizer with the
    reference's update rule (Adam or SGD), the token dispatcher `actor.megatron.token_dispatcher` resolves to.

    Adam: the weights against a bf16 bound (2^-8 relative plus a quarter Adam step) or, in fp32, the CPU
    tests' bound (rtol 1e-4, atol 2e-5). Adam moves every entry by about lr x sign(g), so an entry whose
    gradient is within rounding of zero can move a whole step the other way: this bound cannot tell that
    from an error. SGD moves each entry by lr x g: the update is proportional to the gradient, so its error
    is lr x (the gradient's error). Bound (set before the GPU run): the gradient in bf16 carries the rounding
    of the bf16 weights (2^-9 relative), of each bf16 activation and of the bf16 weight gradient (2^-8 each)
    along a path of a few matmuls per layer; about four units of roundoff, r = 4 x 2^-8 = 1.6e-2, norm-wise
    per tensor; element-wise 4 r (|x| + rms(tensor)) for 99.9% of the elements (the rms term for entries near
    zero). fp32: r = 1e-4. The fp32 rounding of the weight at each step (2^-24 |w|, on both sides) is added
    for updates. Held to it: the update of the fp32 masters (masters after minus the bf16 initial weights
    they start from) against the CPU update, and the reduced fp32 main gradients of each mini-batch against
    the CPU's (the first mini-batch's at the same weights decides; the second's follow weights that already
    differ by the bf16 rounding). `lr_scale` != 1 breaks the GPU run on purpose (a step too large by that
    factor), to show the check fails it."""
    from trainer.backends.megatron.backend import MegatronActor
    from trainer.backends.megatron.gpu import use_megatron_optimizer

    ref = torch.load(path, weights_only=False)
    optimizer = ref.get("optimizer", "adam")
    hf = _tiny_moe()
    hf.load_state_dict(ref["init"])
    cfg = _actor_cfg(optimizer)
    cfg = cfg.model_copy(update={"lr": cfg.lr * lr_scale})
    a = MegatronActor.from_hf(hf, cfg, temperature=1.0, max_response_length=6, device=torch.device("cuda"), dtype=dtype)
    dispatcher = a.bridge.token_dispatcher
    init_gpu = _megatron_named(a)  # the bf16 (or fp32) weights the masters start from
    use_megatron_optimizer(a, "sgd" if optimizer == "sgd" else "adam", adam_eps=RULES[optimizer][2] or 1e-8)
    grads: list[dict[str, torch.Tensor]] = []
    sync = a.ddp.finish_grad_sync

    def recording() -> None:
        sync()
        grads.append({k: p.main_grad.detach().float().cpu().clone() for k, p in a.gpt.named_parameters()})

    a.ddp.finish_grad_sync = recording
    batch = _batch()
    if "old_logprobs" in ref:  # the reference's near-policy old log-probs
        batch.old_logprobs = ref["old_logprobs"]
    metrics = a.update(batch, 2)
    after = dict(a.named_weights())
    worst, n_out, n_all, moved = 0.0, 0, 0, 0.0
    agree, big = 0, 0  # update direction where the CPU update is at least half a step
    step = ref.get("lr", ARGS_LR) if optimizer == "adam" else None  # Adam's step size (sign-like rule only)
    for k, want in ref["after"].items():
        got = after[k].float().cpu()
        d = (got - want).abs()
        d_cpu, d_gpu = want - ref["init"][k].float(), got - ref["init"][k].float()
        if step is not None:
            sel = d_cpu.abs() > step / 2
            big += int(sel.sum())
            agree += int((torch.sign(d_cpu[sel]) == torch.sign(d_gpu[sel])).sum())
        if dtype == torch.bfloat16:
            tol = 2.5e-4 + 8e-3 * want.abs()  # bf16 rounding of the weight (2^-8 relative) + a quarter Adam step
        else:
            tol = 2e-5 + 1e-4 * want.abs()
        n_out += int((d > tol).sum())
        n_all += d.numel()
        worst = max(worst, float(d.max()))
        moved = max(moved, float((want - ref["init"][k]).abs().max()))
    out = {"optimizer_rule": optimizer, "lr": cfg.lr, "lr_scale": lr_scale, "dtype": str(dtype).removeprefix("torch."),
           "reference_dtype": ref.get("dtype", "float32"),
           "dispatcher": dispatcher, "optimizer": type(a.megatron_optimizer).__name__,
           "inner_optimizers": [type(getattr(o, "optimizer", o)).__name__ for o in
                                getattr(a.megatron_optimizer, "chained_optimizers", [a.megatron_optimizer])],
           "grad_norm_gpu": metrics["actor/grad_norm"], "grad_norm_cpu": ref["metrics"]["actor/grad_norm"],
           "pg_loss_gpu": metrics["actor/pg_loss"], "pg_loss_cpu": ref["metrics"]["actor/pg_loss"],
           "experts_module": type(a.gpt.decoder.layers[0].mlp.experts).__name__,
           "attention_module": type(a.gpt.decoder.layers[0].self_attention.core_attention).__name__}
    weights = {"max_abs_weight_diff": worst, "elements_outside_tol": n_out, "elements": n_all, "max_update_cpu": moved}
    if step is not None:
        weights.update(update_sign_agreement=agree / max(big, 1), elements_moved_half_step=big,
                       **{"pass": n_out <= n_all // 1000})
    out["weights_vs_cpu_adam_bound"] = weights
    rtol = SGD_RTOL[dtype]
    if "grads" in ref:  # reduced fp32 main gradients of each mini-batch
        out["grads"] = [_rel_check(g, w, rtol) for g, w in zip(grads, ref["grads"])]
    if "after_megatron" in ref:
        masters = _masters(a) if dtype != torch.float32 else _megatron_named(a)
        u_gpu = {k: masters[k] - init_gpu[k] for k in masters}
        u_cpu = {k: ref["after_megatron"][k] - ref["init_megatron"][k] for k in ref["after_megatron"]}
        out["update"] = _rel_check(u_gpu, u_cpu, rtol, weights=ref["after_megatron"])
        out["update"]["rms_update_cpu"] = float(torch.cat([u.flatten() for u in u_cpu.values()]).pow(2).mean().sqrt())
    if optimizer != "adam":  # the rules whose step is proportional to the gradient
        out["pass"] = out["update"]["pass"] and all(g["pass"] for g in out["grads"][:1])
    else:
        out["pass"] = weights["pass"]
    print("check:", json.dumps(out))
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()
    return out


# --------------------------------------------------------------------------- benchmark

def qwen3_30b_a3b(layers: int):
    """The Qwen3-30B-A3B config (`shape:qwen3-30b-a3b`, trainer/models/specs.py) with its first `layers` layers."""
    from trainer.models.specs import SHAPES

    cls, kw = SHAPES["qwen3-30b-a3b"]
    return cls(**{**kw, "num_hidden_layers": layers})


def active_flops(c, batch: int, seq: int, head_tokens: int | None = None) -> float:
    """Training FLOPs of one step on active parameters: 6 x (attention + k experts + router) matmul
    parameters x tokens, 6 x LM head x the `head_tokens` per row that reach it (all `seq` for a language-model
    loss, the response tokens for an actor), plus causal attention scores (3 x 2 x 2 x s^2/2 x heads x head_dim)."""
    h, hd = c.hidden_size, c.head_dim
    attn = h * c.num_attention_heads * hd * 2 + h * c.num_key_value_heads * hd * 2
    experts = c.num_experts_per_tok * 3 * h * c.moe_intermediate_size + h * c.num_experts
    head = h * c.vocab_size * (seq if head_tokens is None else head_tokens)
    scores = c.num_hidden_layers * 3 * 2 * 2 * (seq * seq / 2) * c.num_attention_heads * hd * batch
    return 6.0 * (c.num_hidden_layers * (attn + experts) * seq + head) * batch + scores


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(step, warmup: int, steps: int) -> float:
    for _ in range(warmup):
        step()
    _sync()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    _sync()
    return (time.perf_counter() - t) / steps


def bench_transformers(c, batch: int, seq: int, impl: str, warmup: int, steps: int, profile: bool = False,
                       accum: int = 1) -> dict:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device("cuda"):  # random init on the GPU (3B parameters at 4 layers: minutes on the CPU)
        model = AutoModelForCausalLM.from_config(c, dtype=torch.bfloat16, attn_implementation="sdpa",
                                                 experts_implementation=impl)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    x = torch.randint(0, c.vocab_size, (batch, seq), device="cuda")

    def step():
        for _ in range(accum):
            loss = model(input_ids=x, labels=x).loss / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)  # as the actor does
        opt.step()
        opt.zero_grad(set_to_none=True)

    s = _timed(step, warmup, steps)
    out = {"seconds": s, "experts_implementation": model.config._experts_implementation}
    if profile:
        out["profile"] = _profile(step)
    return out


def bench_megatron(c, batch: int, seq: int, warmup: int, steps: int, *, grouped_experts: bool = True,
                   sdpa_attention: bool = True, dispatcher: str = "alltoall", fused_adam: bool = True,
                   profile: bool = False, accum: int = 1) -> dict:
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from trainer.backends.megatron.backend import build_bridge, build_gpt_model, init_parallel
    from trainer.backends.megatron.gpu import _Steps, use_fused_adam

    init_parallel(1, 1, seed=0)
    # moe_grouped_gemm=True without TransformerEngine still builds SequentialMLP (recorded as experts_module)
    bridge = build_bridge(c, dtype=torch.bfloat16, use_cpu_initialization=False, moe_grouped_gemm=not grouped_experts,
                          moe_token_dispatcher_type=dispatcher)
    model = build_gpt_model(bridge, grouped_experts=grouped_experts, sdpa_attention=sdpa_attention).cuda().bfloat16()
    ddp = DistributedDataParallel(config=bridge.config, ddp_config=DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=True), module=model)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-5, bf16=True, params_dtype=torch.bfloat16,
                                                 use_distributed_optimizer=True, clip_grad=1.0), [ddp])
    if fused_adam:
        use_fused_adam(opt)
    steps_obj = _Steps(ddp, opt, 1e-5, 0)
    x = torch.randint(0, c.vocab_size, (batch, seq), device="cuda")
    pos = torch.arange(seq, device="cuda")[None].expand(batch, seq)
    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device="cuda"), 1)[None, None]

    def step():
        steps_obj.zero_grad()
        for _ in range(accum):
            loss = ddp(x, pos, mask, labels=x)  # [b, s] per-token loss
            (loss.float().mean() / accum).backward()
        ddp.finish_grad_sync()
        opt.step()

    s = _timed(step, warmup, steps)
    layer = model.decoder.layers[0]
    out = {"seconds": s, "experts_module": type(layer.mlp.experts).__name__,
           "attention_module": type(layer.self_attention.core_attention).__name__,
           "dispatcher": bridge.config.moe_token_dispatcher_type, "optimizer": type(opt).__name__,
           "adam": "fused" if fused_adam else "foreach"}
    if profile:
        out["profile"] = _profile(step)
    ps.destroy_model_parallel()
    return out


def rl_batch(c, rows: int, seq: int, prompt: int):
    """`rows` sequences of `seq` real tokens, the first `prompt` of each its prompt and the rest its response,
    every row its own prompt (so neither backend can share a prompt forward), random advantages."""
    from trainer.components.batch import Batch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, c.vocab_size, (rows, seq), generator=g)
    r = seq - prompt
    b = Batch(input_ids=ids, attention_mask=torch.ones(rows, seq, dtype=torch.long),
              position_ids=torch.arange(seq)[None].expand(rows, seq).clone(), responses=ids[:, prompt:],
              response_mask=torch.ones(rows, r), rollout_logprobs=torch.zeros(rows, r), group_index=torch.arange(rows))
    b.advantages = torch.randn(rows, 1, generator=g).expand(rows, r).contiguous()
    return b


def bench_actor(c, batch: int, seq: int, warmup: int, steps: int, *, backend: str, prompt: int = ACTOR_PROMPT,
                profile: bool = False, accum: int = 1, token_dispatcher: str = "auto", keep_logits: bool = False) -> dict:
    """One optimizer step of the actor the training loops run (`Actor.update`: the policy loss of
    `trainer/algorithms`, log-probs through the chunked LM head, gradient clipping) on `accum`
    micro-batches of `batch` rows: `backend="fsdp2"` is transformers' model (grouped_mm experts) under
    `actor.mixed_precision: bf16_params` (bf16 params, fp32 masters and grad accumulation, fused AdamW),
    `"megatron"` the `MegatronActor` with megatron's DDP and distributed optimizer (fp32 masters) and the
    MoE token dispatcher `actor.megatron.token_dispatcher=token_dispatcher` gives (auto: the loops' default);
    `keep_logits`: `actor.lm_head_keep_logits`."""
    from trainer.backends.actor import Actor

    # strategy as the loops set it: with actor.strategy=megatron the update runs no optimizer / loss witness
    # (trainer/components/invariants.py; Actor.update_witness), as in training (before 2026-12-05 this bench left it
    # at fsdp2, so its Megatron actor rows also timed the loss witness, a cost the training loops do not have)
    cfg = ActorConfig(lr=1e-5, ppo_mini_batch_size=batch * accum, ppo_micro_batch_size_per_gpu=batch, grad_clip=1.0,
                      mixed_precision="bf16_params" if backend == "fsdp2" else "none",
                      strategy="fsdp2" if backend == "fsdp2" else "megatron",
                      megatron={"token_dispatcher": token_dispatcher}, lm_head_keep_logits=keep_logits)
    torch.manual_seed(0)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: a smoke test of the code path
    if backend == "fsdp2":
        from transformers import AutoModelForCausalLM

        with dev:
            model = AutoModelForCausalLM.from_config(c, dtype=torch.bfloat16, attn_implementation="sdpa",
                                                     experts_implementation="grouped_mm")
        actor = Actor(model, cfg, temperature=1.0, max_response_length=seq - prompt, device=dev)
        info = {"experts_implementation": model.config._experts_implementation}
    else:
        from megatron.core import parallel_state as ps

        from trainer.backends.megatron.backend import (
            MegatronActor,
            build_bridge,
            build_gpt_model,
            init_parallel,
        )
        from trainer.backends.megatron.gpu import use_megatron_optimizer

        init_parallel(1, 1, seed=0)
        bridge = build_bridge(c, dtype=torch.bfloat16, use_cpu_initialization=dev.type == "cpu",
                              token_dispatcher=cfg.megatron.resolved_token_dispatcher())
        model = build_gpt_model(bridge).to(dev).bfloat16()
        actor = MegatronActor(model, bridge, c, cfg, temperature=1.0, max_response_length=seq - prompt, device=dev)
        if dev.type == "cuda":  # megatron's DDP and optimizer are CUDA-only; CPU keeps the actor's torch AdamW
            use_megatron_optimizer(actor)
        info = {"dispatcher": bridge.token_dispatcher,
                "optimizer": type(actor.megatron_optimizer or actor.optimizer).__name__}
    b = rl_batch(c, batch * accum, seq, prompt)
    last: dict = {}

    def step():
        last.update(actor.update(b, 1, reuse_forward_as_old=True))

    s = _timed(step, warmup, steps)
    out = {"seconds": s, "backend": backend, "prompt_tokens": prompt, "grad_norm": last.get("actor/grad_norm"),
           "lm_head_keep_logits": keep_logits,
           "perf_mfu_actor": last.get("perf/mfu/actor"), **info}
    if profile:
        out["profile"] = _profile(step)
    if backend == "megatron":
        ps.destroy_model_parallel()
    return out


def _profile(step, rows: int = 30) -> list[dict]:
    """One profiled step: the CUDA kernels that took the most device time (printed and returned)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    total = sum(e.self_device_time_total for e in events)
    print(f"profile: device time {total / 1e3:.1f} ms in {len(events)} kernels; top {rows}:")
    top = []
    for e in events[:rows]:
        top.append({"kernel": e.key[:120], "ms": e.self_device_time_total / 1e3, "calls": e.count})
        print(f"  {e.self_device_time_total / 1e3:8.2f} ms {e.count:6d}x  {e.key[:110]}")
    return [{"total_ms": total / 1e3}] + top


# name -> (function, its keyword arguments): the variants differ from "megatron" in one setting each
VARIANTS = {
    "fsdp2+transformers": (bench_transformers, {"impl": "grouped_mm"}),
    "megatron": (bench_megatron, {}),
    "megatron foreach adam": (bench_megatron, {"fused_adam": False}),
    "megatron allgather": (bench_megatron, {"dispatcher": "allgather"}),
    "megatron unfused attention": (bench_megatron, {"sdpa_attention": False}),
    "megatron moe_grouped_gemm": (bench_megatron, {"grouped_experts": False}),
    "fsdp2 actor": (bench_actor, {"backend": "fsdp2"}),
    "megatron actor": (bench_actor, {"backend": "megatron"}),
    "megatron actor alltoall": (bench_actor, {"backend": "megatron", "token_dispatcher": "alltoall"}),
    "megatron actor keep logits": (bench_actor, {"backend": "megatron", "keep_logits": True}),
    "fsdp2 actor keep logits": (bench_actor, {"backend": "fsdp2", "keep_logits": True}),
}


def bench(layers: int, batch: int, seq: int, peak: float, warmup: int, steps: int, variants: list[str],
          profile: list[str], accum: int = 1) -> list[dict]:
    """Each variant with `accum` micro-batches of `batch x seq` tokens per optimizer step."""
    c = qwen3_30b_a3b(layers)
    rows = []
    for name in variants:
        fn, kw = VARIANTS[name]
        # an actor's LM head sees the response tokens only
        flops = accum * active_flops(c, batch, seq, seq - ACTOR_PROMPT if fn is bench_actor else None)
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        try:
            r = fn(c, batch, seq, warmup=warmup, steps=steps, profile=name in profile, accum=accum, **kw)
            r.update(name=name, accum=accum, tok_s=accum * batch * seq / r["seconds"], mfu_active=flops / r["seconds"] / (peak * 1e12),
                     peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30)
        except Exception as e:  # noqa: BLE001 - a variant that does not run is reported, not hidden
            r = {"name": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
            traceback.print_exc()
        print("bench:", json.dumps({k: v for k, v in r.items() if k != "profile"}), flush=True)
        rows.append(r)
    print(f"\nQwen3-30B-A3B shape, {layers} layers, {accum} x {batch}x{seq} tokens per optimizer step, "
          f"active TFLOP/step {flops / 1e12:.1f}")
    print(f"{'variant':30s} {'tok/s':>10s} {'MFU(active)':>12s} {'peak GiB':>9s}")
    for r in rows:
        if "error" in r:
            print(f"{r['name']:30s} ERROR {r['error'][:80]}")
        else:
            print(f"{r['name']:30s} {r['tok_s']:10.0f} {100 * r['mfu_active']:11.1f}% {r['peak_mem_gib']:9.1f}")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reference", help="CPU: write the fp32 reference here")
    p.add_argument("--optimizer", default="adam", choices=list(RULES), help="--reference: the update rule")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="--reference: fp32, or bf16 params with fp32 masters (needs --base)")
    p.add_argument("--base", help="--reference --dtype bfloat16: the fp32 reference of the rule (its old log-probs)")
    p.add_argument("--check", help="GPU: compare with these references (comma-separated)")
    p.add_argument("--bench", action="store_true")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--variants", default="fsdp2+transformers,megatron,megatron foreach adam",
                   help=f"comma-separated, of: {', '.join(VARIANTS)}")
    p.add_argument("--profile", default="", help="comma-separated variants to profile one step of (top kernels)")
    p.add_argument("--accum", default="1", help="comma-separated micro-batches per optimizer step, one table each")
    p.add_argument("--out", help="write results as JSON here")
    a = p.parse_args()
    results: dict = {}
    if a.reference:
        dtype = getattr(torch, a.dtype)
        if (dtype == torch.bfloat16) != (a.base is not None):
            p.error("--reference: --dtype bfloat16 needs --base (the fp32 reference of the rule); fp32 takes none")
        reference(a.reference, a.optimizer, dtype, a.base)
        return
    for path in a.check.split(",") if a.check else []:
        ref = torch.load(path, weights_only=False)
        rule, ref_bf16 = ref.get("optimizer", "adam"), ref.get("dtype", "float32") == "bfloat16"
        # against a CPU bf16 reference only the GPU bf16 runs compare (same arithmetic, same bound r)
        runs = [(torch.bfloat16, 1.0)] if ref_bf16 else [(torch.float32, 1.0), (torch.bfloat16, 1.0)]
        if rule != "adam":
            runs.append((torch.bfloat16, BROKEN_LR_SCALE))  # must fail
        for dtype, scale in runs:
            key = (f"check_{rule}_{str(dtype).removeprefix('torch.')}" + ("_broken_lr" if scale != 1.0 else "")
                   + ("_vs_cpu_bf16" if ref_bf16 else ""))
            try:
                results[key] = check(path, dtype, scale)
            except Exception as e:  # noqa: BLE001 - reported in the results, the benchmark still runs
                traceback.print_exc()
                results[key] = {"error": f"{type(e).__name__}: {e}"}
    for key, r in results.items():
        if key.startswith("check_") and "error" not in r:
            u = r.get("update", {})
            g = (r.get("grads") or [{}])[0]
            print(f"{key:32s} pass={r['pass']} weights outside adam bound {r['weights_vs_cpu_adam_bound']['elements_outside_tol']}"
                  f" | update outside {u.get('elements_outside')} worst rel {u.get('worst_tensor_rel_err', 0):.2e}"
                  f" | grads(mb1) outside {g.get('elements_outside')} worst rel {g.get('worst_tensor_rel_err', 0):.2e}")
    if a.bench:
        names, prof = a.variants.split(","), [v for v in a.profile.split(",") if v]
        unknown = sorted(set(names + prof) - set(VARIANTS))
        if unknown:
            p.error(f"--variants/--profile: unknown {unknown} (choose from {', '.join(VARIANTS)})")
        results["bench"] = [r for accum in a.accum.split(",") for r in
                            bench(a.layers, a.batch, a.seq, a.peak_tflops, a.warmup, a.steps, names, prof, int(accum))]
    if a.out:
        import megatron.core
        import transformers

        results["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                               "megatron-core": megatron.core.__version__,
                               "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
        with open(a.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()

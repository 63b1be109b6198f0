"""The chunked LM head at the Qwen3-30B-A3B shape on one GPU: eager chunks against the compiled chunks
(`trainer.ops.logprobs.lm_head_logprobs`, `compile_backend`), timed, and both against an fp64 reference.

    python3 tools/sm90/lm_head_bench.py --out lm_head.json

Inputs: hidden [M, 2048] and head weight [151936, 2048] in bf16 (fresh random draws), targets uniform; the loss
is sum(a * logp) (+ sum(b * H) with `entropy grad`), a, b random. Timed: forward + backward, median of CUDA-event
timings after warm-up (the compile happens in the warm-up). Parity: on `--ref-rows` rows, logp and entropy
(max abs error) and the hidden / weight gradients (norm-wise relative error) of each path against the same
math in fp64 on the bf16 inputs upcast (the bf16 rounding of the logits the kernels read is part of the error).
Also: the fp32 += bf16 gradient accumulation (megatron DDP's and bf16_params' hook) at one expert tensor's size.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from types import SimpleNamespace

from trainer.ops.logprobs import lm_head_logprobs


def _time(fn, warmup: int = 2, reps: int = 7) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def run(m: int, chunk: int, ref_rows: int, seed: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)
    hdim, vocab = 2048, 151936
    h = (torch.randn(m, hdim, device="cuda", generator=g) * 1.0).bfloat16().requires_grad_(True)
    w = (torch.randn(vocab, hdim, device="cuda", generator=g) * 0.02).bfloat16().requires_grad_(True)
    t = torch.randint(0, vocab, (m,), device="cuda", generator=g)
    a = torch.randn(m, device="cuda", generator=g) / m
    b = torch.randn(m, device="cuda", generator=g) / m
    head = SimpleNamespace(weight=w, bias=None)
    out: dict = {"M": m, "chunk": chunk, "H": hdim, "V": vocab}

    def step(backend, ent_grad, keep=True):
        h.grad = w.grad = None
        lp, ent = lm_head_logprobs(h, head, t, chunk_size=chunk, with_entropy=True, compile_backend=backend)
        loss = (lp * a).sum() + ((ent * b).sum() if ent_grad else 0.0)
        loss.backward()
        return (lp.detach(), ent.detach(), h.grad.detach().clone(), w.grad.detach().clone()) if keep else None

    # fp64 reference on the first ref_rows rows
    r = ref_rows
    hd, wd = h.detach()[:r].double().requires_grad_(True), w.detach().double().requires_grad_(True)
    la = torch.log_softmax(F.linear(hd, wd), dim=-1)
    lp_ref = la.gather(-1, t[:r, None]).squeeze(-1)
    ent_ref = -(la.exp() * la).sum(-1)
    refs = {}
    for ent_grad in (False, True):
        loss = (lp_ref * a[:r].double()).sum() + ((ent_ref * b[:r].double()).sum() if ent_grad else 0.0)
        refs[ent_grad] = torch.autograd.grad(loss, [hd, wd], retain_graph=True)
    del la
    torch.cuda.empty_cache()

    for name, backend in (("eager", None), ("compiled", "inductor")):
        for ent_grad in (False, True):
            key = f"{name}{'_entropy_grad' if ent_grad else ''}"
            ms = _time(lambda: step(backend, ent_grad, keep=False))
            # parity on the reference rows: rerun on those rows alone
            h.grad = w.grad = None
            hr = h.detach()[:r].clone().requires_grad_(True)
            lp, ent = lm_head_logprobs(hr, head, t[:r], chunk_size=chunk, with_entropy=True, compile_backend=backend)
            loss = (lp * a[:r]).sum() + ((ent * b[:r]).sum() if ent_grad else 0.0)
            gh, gw = torch.autograd.grad(loss, [hr, w])
            rh, rw = refs[ent_grad]
            rel = lambda x, y: float((x.double() - y).norm() / y.norm())  # noqa: E731
            out[key] = {"ms_fwd_bwd": ms, "tok_s": m / ms * 1e3,
                        "logp_max_abs_err": float((lp.double() - lp_ref).abs().max()),
                        "entropy_max_abs_err": float((ent.double() - ent_ref).abs().max()),
                        "dhidden_rel_err": rel(gh, rh), "dweight_rel_err": rel(gw, rw)}
            print(key, json.dumps(out[key]), flush=True)
    # compiled against eager on the full M (same bf16 inputs)
    e = step(None, True)
    c = step("inductor", True)
    out["compiled_vs_eager"] = {
        "logp_max_abs": float((e[0] - c[0]).abs().max()), "entropy_max_abs": float((e[1] - c[1]).abs().max()),
        "dhidden_rel": float((e[2].float() - c[2].float()).norm() / e[2].float().norm()),
        "dweight_rel": float((e[3].float() - c[3].float()).norm() / e[3].float().norm())}
    print("compiled_vs_eager", json.dumps(out["compiled_vs_eager"]), flush=True)
    return out


def grad_add(n: int) -> dict:
    """fp32 main grad += bf16 grad at `n` elements: the eager mixed-dtype add against alternatives."""
    main = torch.randn(n, device="cuda")
    g = torch.randn(n, device="cuda").bfloat16()
    compiled = torch.compile(lambda x, y: x.add_(y), dynamic=False)
    res = {"elements": n, "bytes_min": n * 10}
    for name, fn in (("eager_add_", lambda: main.add_(g)), ("compiled_add_", lambda: compiled(main, g)),
                     ("copy_bf16_to_fp32", lambda: main.copy_(g))):
        ms = _time(fn, 3, 10)
        res[name] = {"ms": ms, "GB_s": (n * (10 if "add" in name else 6)) / ms / 1e6}
    print("grad_add", json.dumps(res), flush=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--ref-rows", type=int, default=512)
    p.add_argument("--out")
    a = p.parse_args()
    res = {"lm_head": run(a.tokens, a.chunk, a.ref_rows, 0), "grad_add": grad_add(128 * 1536 * 2048),
           "torch": torch.__version__, "device": torch.cuda.get_device_name()}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()

"""GPU machine: the single-process colocated loop with `actor.strategy: megatron` on a tiny random-init MoE.

    python3 tools/sm90/megatron_loop_gpu.py --out $OUT/loop

For `model.dtype` float32 and bfloat16 (tiny:qwen3_moe, router load-balancing loss 0.01, hf engine,
`trainer.device: cuda`, `actor.megatron.optimizer: auto`): which optimizer the actor the loop builds holds
(megatron's DDP + distributed optimizer is expected on CUDA), then four runs of the loop: an uninterrupted
4-step run, a second one (the run-to-run spread of the GPU kernels), a run stopped after its checkpoint at
step 2 and its resume to step 4. Writes each run's metrics.jsonl and summary.json (the largest relative
difference of every logged number, timings left out, resume vs uninterrupted and uninterrupted vs
uninterrupted).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def sections(dtype: str, device: str = "cuda", optimizer: str = "auto") -> dict:
    return {"model": {"path": "tiny:qwen3_moe", "dtype": dtype},
            "trainer": {"total_steps": 4, "save_freq": 2, "test_freq": 2, "device": device},
            "actor": {"ppo_mini_batch_size": 2, "strategy": "megatron", "entropy_coeff": 0.01,
                      "moe_aux_loss_coeff": 0.01, "megatron": {"optimizer": optimizer}}}


def numbers(rows: list[dict]) -> dict[int, dict[str, float]]:
    return {r["step"]: {k: v for k, v in r["data"].items() if not k.startswith(("timing_s/", "perf/"))
                        and isinstance(v, int | float)} for r in rows}


def max_rel(a: dict[int, dict], b: dict[int, dict]) -> dict:
    worst, key, missing = 0.0, None, []
    for step in sorted(a):
        if step not in b:
            missing.append(step)
            continue
        for k, va in a[step].items():
            vb = b[step].get(k)
            if vb is None:
                missing.append(f"{step}:{k}")
                continue
            rel = abs(va - vb) / max(abs(va), abs(vb), 1e-6)
            if rel > worst:
                worst, key = rel, f"step {step} {k}"
    return {"max_rel_diff": worst, "where": key, "missing": missing[:10]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--device", default="cuda", help="cpu: a smoke test of this script")
    p.add_argument("--optimizer", default="auto", help="actor.megatron.optimizer (auto: megatron's on CUDA)")
    a = p.parse_args()
    import torch

    from tests.helpers.configs import tiny_config
    from trainer.api import train
    from trainer.config import load_config
    from trainer.components.metrics import read_metrics

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu", "torch": torch.__version__}
    for dtype in a.dtypes.split(","):
        res: dict = {}
        summary[dtype] = res
        try:
            from megatron.core import parallel_state as ps

            from trainer.modes.steps import build_components

            c = build_components(load_config(tiny_config(str(out / f"{dtype}_probe"), **sections(dtype, a.device, a.optimizer))),
                                 with_engine=False)
            opt = c.actor.megatron_optimizer
            res["actor"] = {"class": type(c.actor).__name__, "optimizer_impl": c.actor.optimizer_impl,
                            "megatron_optimizer": type(opt).__name__ if opt is not None else None,
                            "inner": [type(getattr(o, "optimizer", o)).__name__
                                      for o in getattr(opt, "chained_optimizers", [opt])] if opt is not None else None,
                            "model_wrapper": type(c.actor.model).__name__,
                            "param_dtype": str(next(c.actor.gpt.parameters()).dtype),
                            "dispatcher": c.actor.bridge.token_dispatcher}
            print(dtype, "actor:", json.dumps(res["actor"]), flush=True)
            del c
            ps.destroy_model_parallel()
            runs = {}
            for name, dirname, extra in (("full", "full", []), ("full2", "full2", []),
                                         ("part", "part", ["trainer.total_steps=2"]), ("resumed", "part", [])):
                t = time.perf_counter()
                path = train(load_config(tiny_config(str(out / f"{dtype}_{dirname}"), **sections(dtype, a.device, a.optimizer)), extra))
                runs[name] = read_metrics(path)
                res[f"seconds_{name}"] = round(time.perf_counter() - t, 1)
                print(dtype, name, "done in", res[f"seconds_{name}"], "s", flush=True)
            full, full2, resumed = (numbers(runs[k]) for k in ("full", "full2", "resumed"))
            res["steps_resumed"] = [r["step"] for r in runs["resumed"]]
            res["resume_vs_uninterrupted"] = max_rel(full, resumed)
            res["uninterrupted_vs_uninterrupted"] = max_rel(full, full2)
            res["last_step"] = {k: full[max(full)][k] for k in sorted(full[max(full)])
                                if k.startswith(("actor/", "critic/score", "val-core"))}
            res["grad_norm_per_step"] = [full[s].get("actor/grad_norm") for s in sorted(full) if s > 0]
        except Exception as e:  # noqa: BLE001 - reported, the next dtype still runs
            traceback.print_exc()
            res["error"] = f"{type(e).__name__}: {str(e)[:500]}"
        print(dtype, json.dumps({k: v for k, v in res.items() if k != "last_step"}), flush=True)
    for dtype in a.dtypes.split(","):
        src = out / f"{dtype}_part" / "metrics.jsonl"
        if src.is_file():
            shutil.copy(src, out / f"{dtype}_resumed_metrics.jsonl")
        src = out / f"{dtype}_full" / "metrics.jsonl"
        if src.is_file():
            shutil.copy(src, out / f"{dtype}_full_metrics.jsonl")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

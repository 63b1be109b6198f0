"""Build verl file-logger JSONL logs shaped like a published run, for checks and CLI tests.

    from tests.helpers.verl_logs import write_qwen3_8b_grpo_log
    path = write_qwen3_8b_grpo_log(tmp_path / "run.jsonl")                 # passes the full profile
    bad = write_qwen3_8b_grpo_log(tmp_path / "bad.jsonl", gsm8k_peak=0.90)  # GSM8K plateaus at 0.90

The curves follow the published Qwen3-8B GRPO run on MI350 (REFERENCES.md section 1, suite
`verl_grpo_qwen3_8b_sglang_gfx950`): 200 steps, validation every 5 steps (step 0 included),
GSM8K val 0.82 -> ~0.955 within ~30 steps and held, MATH 0.37 -> ~0.835 rising steadily, mean
reward 0.62 -> ~0.90, actor/ppo_kl ~1e-4 throughout. Each is a saturating exponential

    x(t) = start + (plateau - start) * (1 - exp(-t / tau))

plus seeded noise of a fraction of a point. Every step is written as several JSONL lines, the
way verl's file logger may split a step (training metrics, timing, validation).
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path


def _sat(t: float, start: float, plateau: float, tau: float) -> float:
    return start + (plateau - start) * (1.0 - math.exp(-t / tau))


def qwen3_8b_grpo_steps(*, steps: int = 200, test_freq: int = 5, gsm8k_peak: float = 0.955,
                        math_peak: float = 0.835, seed: int = 0) -> list[dict]:
    """`[{"step": N, "data": {...}}, ...]`, several records per step, in file order."""
    rng = random.Random(seed)
    noise = lambda s: rng.uniform(-s, s)
    records: list[dict] = []
    for t in range(steps + 1):
        if t > 0:
            records.append({"step": t, "data": {
                "critic/score/mean": _sat(t, 0.62, 0.90, 25.0) + noise(0.005),
                "critic/rewards/mean": _sat(t, 0.62, 0.90, 25.0) + noise(0.005),
                "actor/ppo_kl": 1e-4 * (1.0 + 0.3 * math.sin(t / 7.0)),
                "actor/pg_loss": -0.01 + noise(0.01),
                "actor/entropy": 0.5 - 0.001 * t,
                "response_length/mean": 600.0 + noise(20.0),
            }})
            records.append({"step": t, "data": {
                "timing_s/gen": 40.0 + noise(2.0), "timing_s/update_actor": 30.0 + noise(2.0),
                "timing_s/step": 80.0 + noise(3.0), "perf/throughput": 1200.0 + noise(50.0),
            }})
        if t % test_freq == 0:
            plateau_gsm8k = gsm8k_peak - 0.002
            records.append({"step": t, "data": {
                "val-core/openai/gsm8k/acc/mean@1": (0.82 if t == 0 else
                                                     min(_sat(t, 0.82, plateau_gsm8k, 8.0) + noise(0.002),
                                                         gsm8k_peak)),
                "val-core/lighteval/MATH/acc/mean@1": (0.37 if t == 0 else
                                                       min(_sat(t, 0.37, math_peak + 0.005, 50.0) + noise(0.002),
                                                           math_peak)),
            }})
    return records


def write_qwen3_8b_grpo_log(path: str | Path, *, truncated_tail: bool = False, **kw: float) -> Path:
    """Write the log to `path` (one JSON object per line); `truncated_tail` cuts the last line short."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) for r in qwen3_8b_grpo_steps(**kw)]  # type: ignore[arg-type]
    text = "\n".join(lines) + "\n"
    if truncated_tail:
        text += lines[-1][: len(lines[-1]) // 2]
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------- console shapes
RAY = "(TaskRunner pid=123) "


def verl_console_items(step: int) -> list[tuple[str, str]]:
    """One verl console step as (key, printed value) pairs, with numpy reprs, negatives, exponents."""
    return [
        ("actor/ppo_kl", f"np.float64({1e-4 * (1 + step % 3)!r})"),
        ("critic/returns/min", f"{-0.25 - step / 100:.3f}"),
        ("response_length/mean", f"{368.902 + step:.3f}"),
        ("training/global_step", str(step)),
        ("actor/lr", "1e-06"),
        ("critic/score/mean", f"np.float32({0.5 + step / 100:.4f})"),
        ("timing_s/old_log_prob", f"{6.1234 + step:.4f}"),
        ("perf/total_num_tokens", f"np.int64({4096 * step})"),
        ("val-core/openai/gsm8k/acc/mean@1", "nan" if step % 2 else f"{0.8 + step / 1000:.3f}"),
    ]


def verl_console_line(step: int, prefix: str = RAY) -> str:
    """`(TaskRunner pid=123) step:N - key:value - ...` as verl's console logger prints it."""
    return f"{prefix}step:{step} - " + " - ".join(f"{k}:{v}" for k, v in verl_console_items(step))


def verl_console_log(steps: range, prefix: str = RAY) -> list[str]:
    """Step lines with the unrelated lines a real console log has between them (tqdm, INFO)."""
    out = ["2026-01-01 12:00:00 INFO Loading model from /models/qwen"]
    for s in steps:
        out.append(verl_console_line(s, prefix))
        out.append(f"{prefix}Training Progress:  {s}0%|#         | {s}/10 [00:12<01:50, 12.2s/it]")
    return out


def wrap(lines: list[str], width: int, *, strip: bool = True) -> list[str]:
    """Break every line into `width`-character physical lines, as a terminal or collector does
    (`strip`: trailing spaces at each break are lost, as copy-paste from a terminal loses them)."""
    out: list[str] = []
    for line in lines:
        for i in range(0, max(len(line), 1), width):
            piece = line[i:i + width]
            out.append(piece.rstrip() if strip else piece)
    return out


def miles_perf_record(rollout: int) -> str:
    """A Miles rollout-manager record, `perf N: {...}`, as one line."""
    body = {"perf/rollout_time": 150.0 + rollout, "perf/tokens_per_gpu_per_sec": 1200.5 + rollout,
            "rollout/raw_reward": 0.25 + rollout / 10, "perf/step_time": 388.5}
    inner = ", ".join(f"'{k}': {'np.float64(' + repr(v) + ')' if 'tokens' in k else repr(v)}" for k, v in body.items())
    return f"[2026-01-01 10:00:0{rollout}] INFO rollout.py:120 - perf {rollout}: {{{inner}}}"

"""A one-line progress display for long runs: step, reward, validation accuracy, step time."""

from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    def __init__(self, *, total: int, initial: int = 0, enabled: bool = True):
        self.bar = tqdm(total=total, initial=initial, desc="rlbench", unit="step", dynamic_ncols=True,
                        disable=not enabled, file=sys.stderr)
        self.val: dict[str, float] = {}

    def update_val(self, val: dict[str, float]) -> None:
        self.val = {"/".join(k.split("/")[1:-2]): v for k, v in val.items() if k.startswith("val-core/")}

    def step(self, m: dict[str, float]) -> None:
        post = {"score": f"{m.get('critic/score/mean', float('nan')):.3f}",
                "kl": f"{m.get('actor/ppo_kl', float('nan')):.1e}",
                "s/step": f"{m.get('timing_s/step', float('nan')):.1f}"}
        post.update({f"val:{k}": f"{v:.3f}" for k, v in self.val.items()})
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()

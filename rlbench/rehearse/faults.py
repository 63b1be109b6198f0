"""Planted faults for rehearsals: a defect in the parallel path that a rehearsal must fail on.

    python -m rlbench.rehearse miles_grpo_qwen3_30b_a3b_gfx942 --profile full --fault tp_shard

`tp_shard`: the Megatron weight export (`trainer/backends/megatron/backend.py: export_hf_weights`, which
gathers each tensor-parallel weight's shards and merges them with mbridge's `_weight_merge_across_tp`)
skips the last TP rank's shards and merges rank 0's in their place: every TP-split weight the rollout
engine receives has its last slice wrong, while the trainer keeps the right weights. Nothing stops; only a
check comparing engine and trainer can see it (the rehearsal's logprob_agreement / weight_sync).

The fault is planted in every process of the run (driver, Ray workers) by `rlbench/rehearse/hooks/
sitecustomize.py`, which the rehearsal puts on PYTHONPATH with RLBENCH_REHEARSAL_FAULT set; it patches
mbridge's class when that module is imported. A value naming no fault is an error.
"""

from __future__ import annotations

import sys
from typing import Any

FAULTS = ("tp_shard",)
MARKER = "[planted fault]"


def plant(name: str, module: Any) -> None:
    if name not in FAULTS:
        raise ValueError(f"RLBENCH_REHEARSAL_FAULT={name!r}: not a planted fault (choose one of: {', '.join(FAULTS)})")
    if name == "tp_shard":
        cls = module.Bridge
        merge = cls._weight_merge_across_tp

        def skip_last_rank(self, mcore_weights_name, mcore_weights, param, *args, **kwargs):
            parts = list(mcore_weights)
            if len(parts) > 1:
                parts[-1] = parts[0]  # the last TP rank's shards skipped: rank 0's merged in their place
            return merge(self, mcore_weights_name, parts, param, *args, **kwargs)

        cls._weight_merge_across_tp = skip_last_rank
        print(f"{MARKER} tp_shard: mbridge Bridge._weight_merge_across_tp skips the last TP rank's shards",
              file=sys.stderr, flush=True)

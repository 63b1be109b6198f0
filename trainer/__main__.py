"""Train with RL from a YAML config, with `key.sub=value` overrides.

    python -m trainer trainer/configs/grpo_smollm2_arithmetic.yaml
    python -m trainer trainer/configs/grpo_smollm2_arithmetic.yaml trainer.total_steps=5 actor.lr=2e-6

Writes `<trainer.out_dir>/metrics.jsonl` (one line per step, verl's names; see docs/metrics.md),
`config.yaml` (resolved), `env.json` and checkpoints. Bad input prints one line and exits 2.
The same command again resumes from the newest intact checkpoint, or says the run is complete
(`trainer.resume=false` starts over; docs/resume.md).
"""

from __future__ import annotations

import argparse
import sys

from trainer.errors import RLBenchError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description="RL post-training (GRPO / DAPO / PPO).")
    parser.add_argument("config", help="YAML config (see trainer/configs/)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. actor.lr=1e-6 trainer.total_steps=10")
    args = parser.parse_args(argv)
    try:
        from trainer.api import train
        from trainer.config import load_config

        cfg = load_config(args.config, args.overrides)
        path = train(cfg)
    except RLBenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the metrics and checkpoints written so far are kept; rerun the same command to "
              "resume", file=sys.stderr)
        return 130
    print(f"metrics: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

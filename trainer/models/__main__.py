"""Build (or show) the cached tool-format warm start of a model (`trainer/models/warm_start.py`).

    python -m trainer.models --steps 20 --tool-fraction 0.6     # build (or show) the cached model
    python -m trainer.models --steps 3 --tool-fraction 0.9 --batch-size 8 --lr 3e-4   # the retool cpu profile's

Here rather than in warm_start.py: it loads the base model through `trainer.models.loading`, the
loader, which applies the warm starts and so stands above them.
"""

from __future__ import annotations

import argparse
import json
import sys

from trainer.config import ModelConfig, WarmStartConfig
from trainer.errors import RLBenchError
from trainer.models.warm_start import cache_folder, read_facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.models", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="embedded:smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=WarmStartConfig.model_fields["steps"].default)
    parser.add_argument("--tool-fraction", type=float, default=WarmStartConfig.model_fields["tool_fraction"].default)
    parser.add_argument("--difficulty", default="hard")
    parser.add_argument("--batch-size", type=int, default=WarmStartConfig.model_fields["batch_size"].default)
    parser.add_argument("--lr", type=float, default=WarmStartConfig.model_fields["lr"].default)
    args = parser.parse_args(argv)
    try:
        from pydantic import ValidationError

        from trainer.models.loading import load_model_and_tokenizer

        try:
            cfg = ModelConfig(path=args.model, warm_start=WarmStartConfig(
                steps=args.steps, tool_fraction=args.tool_fraction, difficulty=args.difficulty,
                batch_size=args.batch_size, lr=args.lr))
        except ValidationError as exc:
            err = exc.errors()[0]
            print(f"error: --{err['loc'][-1]}: {err['msg']}", file=sys.stderr)
            return 2
        load_model_and_tokenizer(cfg)
        print(f"{cache_folder(cfg, 0)}\n{json.dumps(read_facts(cfg), indent=2)}")
    except RLBenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m rlbench ...` is the `rlbench` command (see rlbench/cli.py).

    python -m rlbench list
    python -m rlbench run suites/verl_grpo_qwen3_8b_sglang_gfx950.yaml --profile cpu
"""

from __future__ import annotations

import sys

from rlbench.cli import main

if __name__ == "__main__":
    sys.exit(main())

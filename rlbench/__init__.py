"""rlbench: replay published RL post-training case studies and check parity.

    rlbench run suites/verl_grpo_qwen3_8b_sglang_gfx950.yaml --profile cpu
    pytest suites/ --arch cpu
"""

__version__ = "0.1.0"

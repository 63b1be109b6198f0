"""rlbench: replay published RL post-training case studies and check parity.

    rlbench run suites/verl_grpo_qwen3_8b_sglang_gfx950.yaml --profile cpu
    pytest suites/ --arch cpu

One package per concept, lowest first (a module imports its own layer and those below, and any
trainer module; tests/unit/test_import_layers.py checks it): suites, store, ingest, checks, report,
run, rehearse, selftest, run.pytest_plugin, cli.
"""

__version__ = "0.1.0"

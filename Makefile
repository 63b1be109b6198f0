# rlbench: the two commands of the README, plus the pieces they are made of.
#
#   make train    # install, then train SmolLM2-135M-Instruct with GRPO on synthetic addition (2 CPU cores, ~10-15 min)
#   make test     # install, then unit + integration tests and every suite's `cpu` profile
#
PYTHON ?= python3

.PHONY: install train test test-unit test-suites bench

install:
	bash ci/setup.sh

train: install
	$(PYTHON) -m trainer trainer/configs/grpo_smollm2_arithmetic.yaml

test: install
	$(PYTHON) -m pytest -q
	$(PYTHON) -m pytest suites/ --arch cpu -q --rlbench-report runs/pytest-suites/report.html

test-unit:
	$(PYTHON) -m pytest -q tests/unit

bench:
	$(PYTHON) tests/benchmarks/bench_cpu_step.py

# rlbench: the two commands of the README, plus the pieces they are made of.
#
#   make train    # install, then train SmolLM2-135M-Instruct with GRPO on synthetic addition (2 CPU cores, ~10-15 min)
#   make test     # install, then unit + integration tests and every suite's `cpu` profile (make test-suites)
#   make selftest # plant each known trainer bug in a scratch copy, run the cpu profile's first step, table
#                 # of the checks that caught it (reports/selftest/; 15 short SmolLM2 runs)
#
PYTHON ?= python3

.PHONY: install train test test-unit test-suites bench selftest

install:
	bash ci/setup.sh

train: install
	$(PYTHON) -m trainer trainer/configs/grpo_smollm2_arithmetic.yaml

test: install
	$(PYTHON) -m pytest -q
	$(MAKE) --no-print-directory test-suites

test-unit:
	$(PYTHON) -m pytest -q tests/unit

# Every suite's cpu profile (real SmolLM2 training runs; ~36-45 min on 2 cores) and the cpu-vllm profile of
# the suites that define one (DAPO: vLLM, colocated and fully-async on Ray; skipped without vLLM),
# report in runs/pytest-suites/.
test-suites:
	$(PYTHON) -m pytest suites/ --arch cpu -q --rlbench-report runs/pytest-suites/report.html

# The first step of the GRPO suite's cpu profile with 4 prompts (2 mini-batches) on 1 thread, per
# mutation and per clean seed: the settings of reports/selftest/ (about 3 min a run on a busy 2-core box).
selftest:
	$(PYTHON) -m rlbench selftest --set data.train_batch_size=4 --set actor.ppo_mini_batch_size=2 \
		--set trainer.num_threads=1

bench:
	$(PYTHON) tests/benchmarks/bench_cpu_step.py

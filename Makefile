# rlbench: the two commands of the README, plus the pieces they are made of.
#
#   make train    # install, then train SmolLM2-135M-Instruct with GRPO on synthetic addition (2 CPU cores, ~10-15 min)
#   make test     # install, then unit + integration tests and every suite's `cpu` profile (make test-suites)
#   make selftest # plant each known trainer bug in a scratch copy, run the cpu profile's first step, table
#                 # of the checks that caught it (reports/selftest/; 15 short SmolLM2 runs)
#   make rehearse # every suite's full and mini profile on CPU at tiny scale, verdict on mechanics (reports/rehearsal/)
#   make selftest-random  # RANDOM_N mutants drawn from the trainer's code, mutation score (reports/selftest/)
#
PYTHON ?= python3

.PHONY: install train test test-unit test-suites test-suites-all bench selftest selftest-random rehearse

install:
	bash ci/setup.sh

train: install
	$(PYTHON) -m trainer trainer/configs/grpo_smollm2_arithmetic.yaml

# The default tier in TEST_WORKERS pytest-xdist processes (one torch thread each), then the few tests that
# assert on wall time (marker `timing`) alone, then the suites.
TEST_WORKERS ?= 2
test: install
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) -m 'not slow and not gpu and not vllm and not timing'
	$(PYTHON) -m pytest -q -m timing
	$(MAKE) --no-print-directory test-suites

test-unit:
	$(PYTHON) -m pytest -q tests/unit

# Every suite's cpu profile (real SmolLM2 training runs on 2 cores), the cpu-vllm profile of the suites that
# define one (DAPO: vLLM on Ray; skipped without vLLM) and the cpu-vlm one, report in runs/pytest-suites/.
# test-suites leaves out the modes a profile lists in `slow_modes` (the retool and geometry3k cpu profiles' and
# DAPO cpu-vllm's fully-async runs, ~10 min; rlbench/run/pytest_plugin.py); test-suites-all runs every mode.
test-suites:
	$(PYTHON) -m pytest suites/ --arch cpu -q -m 'not slow' --rlbench-report runs/pytest-suites/report.html

test-suites-all:
	$(PYTHON) -m pytest suites/ --arch cpu -q --rlbench-report runs/pytest-suites-all/report.html

# The first step of the GRPO suite's cpu profile with 4 prompts (2 mini-batches) on 1 thread, per
# mutation and per clean seed: the settings of reports/selftest/ (about 3 min a run on a busy 2-core box).
selftest:
	$(PYTHON) -m rlbench selftest --set data.train_batch_size=4 --set actor.ppo_mini_batch_size=2 \
		--set trainer.num_threads=1

# RANDOM_N mutants drawn with seed RANDOM_SEED from the trainer's own code by ast operators, each trained one
# step on a tiny random llama (SmolLM2's architecture) and checked; the mutation score, equivalent mutants apart
# (rlbench/selftest/random_mutants.py). Not part of `make test`.
RANDOM_N ?= 40
RANDOM_SEED ?= 0
selftest-random:
	$(PYTHON) -m rlbench selftest --random $(RANDOM_N) --random-seed $(RANDOM_SEED)

# Every suite x {full, mini} x mode rehearsed on CPU, one at a time (rlbench/rehearse/: tiny models of the same
# architectures, the profiles' engines, backends and parallel layouts); the table in reports/rehearsal/README.md,
# the lines `rlbench list` prints. Not part of `make test` (the transform's unit test is).
rehearse:
	nice -n 10 $(PYTHON) -m pytest suites/ --rehearse -q -p no:cacheprovider

bench:
	$(PYTHON) tests/benchmarks/bench_cpu_step.py
